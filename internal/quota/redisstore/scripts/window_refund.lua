-- Give back units that fixed_window.lua or sliding_window.lua admitted,
-- because another policy denied the request.
--
-- KEYS[1]  the counter (see those scripts)
-- ARGV[1]  window in µs
-- ARGV[2]  1 for a sliding window, 0 for a fixed one
-- ARGV[3]  now in µs for tests; empty: Redis TIME
-- ARGV[4]  units given back
--
-- The unit was counted in the current window, or, when the window turned
-- between take and refund, in what is now the previous one: a sliding
-- window gives it back there; a fixed window's previous count is gone.
-- Returns 1 when units were given back.
local w = tonumber(ARGV[1])
local n = tonumber(ARGV[4]) or 1
local now = now_us(ARGV[3])
local ws = now - (now % w)
local st = redis.call('HMGET', KEYS[1], 'w', 'c')
local sw, c = tonumber(st[1]), tonumber(st[2]) or 0
if sw == ws then
  if c > 0 then redis.call('HSET', KEYS[1], 'c', string.format('%d', math.max(c - n, 0))) end
  return 1
end
if ARGV[2] == '1' and sw == ws - w and c > 0 then
  redis.call('HSET', KEYS[1], 'w', string.format('%d', ws), 'p', string.format('%d', math.max(c - n, 0)), 'c', '0')
  return 1
end
return 0
