-- Take a request's cost from a calendar window counter (a fixed window
-- whose bounds follow the calendar of a time zone), atomically, all or
-- none; or give units back. Lua has no time zones: the caller sends the
-- bounds of the windows around its own clock's now (see
-- internal/quota/calendar.go), and the script counts in the one holding
-- Redis TIME.
--
-- KEYS[1]  the counter, a hash laid out as window_take.lua's: w = start
--          of the window counted (µs), c = units admitted in it.
-- ARGV[1]  take, charge (charge: always: counted whatever the count,
--          window_take.lua) or refund
-- ARGV[2]  limit
-- ARGV[3]  now in µs for tests; empty: Redis TIME, never a replica's clock
-- ARGV[4]  units (the cost; 0 decides as for one and counts nothing), or
--          the units given back
-- ARGV[5]  block_for in µs, the penalty box (window_take.lua); empty: none
-- ARGV[6…] window bounds in µs, ascending: the windows [ARGV[i], ARGV[i+1])
--
-- take returns window_take's {allowed, remaining, retry, reset, delay, granted}; refund returns 1 when units were given back.
-- Redis TIME outside every window sent (the clocks a window apart) is an
-- error, not a guess.
local limit = tonumber(ARGV[2])
-- Keys expire on Redis' own clock. With injected test time that is not
-- the clock deciding: keep such keys a minute at least.
local keep = 0
if tonumber(ARGV[3]) then keep = 60000 end
local now = now_us(ARGV[3])
local n = tonumber(ARGV[4]) or 1

local ws, we
for i = 6, #ARGV - 1 do
  local a, b = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  if a <= now and now < b then
    ws, we = a, b
    break
  end
end
if not ws then
  return redis.error_reply('calendar_window: time ' .. string.format('%d', now) .. ' is outside the windows sent')
end

if ARGV[1] == 'refund' then
  local st = redis.call('HMGET', KEYS[1], 'w', 'c')
  local c = 0
  if tonumber(st[1]) == ws then c = tonumber(st[2]) or 0 end
  if c > 0 then
    redis.call('HSET', KEYS[1], 'c', string.format('%d', math.max(c - n, 0)))
    return 1
  end
  return 0
end

return window_take(KEYS[1], ws, we, now, n, math.max(n, 1), limit, keep, 0, -1, 0, ARGV[1] == 'charge', tonumber(ARGV[5]) or 0, 0)
