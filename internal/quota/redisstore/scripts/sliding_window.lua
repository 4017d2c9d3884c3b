-- Take one unit from a sliding window counter (Cloudflare's weighted two
-- windows), atomically. The math, and why the wait is exact, is in
-- internal/quota/windows.go.
--
-- KEYS[1]  the counter, a hash: w = start of the window counted (µs, epoch
--          aligned), p = the previous window's count, c = this window's.
-- ARGV[1]  window in µs
-- ARGV[2]  limit
-- ARGV[3]  now in µs for tests; empty: Redis TIME, never a replica's clock
--
-- Returns {allowed, remaining, retry, reset, delay}: 1 or 0; units that
-- would still fit now; µs until one fits when rejected (else 0); µs until
-- the estimate is back to zero; 0.
local w = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
-- Keys expire on Redis' own clock. With injected test time that is not
-- the clock deciding, and a test may run longer than a TTL computed from
-- injected instants: keep such keys a minute at least.
local keep = 0
if tonumber(ARGV[3]) then keep = 60000 end
local now = now_us(ARGV[3])
local ws = now - (now % w)
local e = now - ws

local st = redis.call('HMGET', KEYS[1], 'w', 'p', 'c')
local sw = tonumber(st[1])
local p, c = 0, 0
if sw == ws then
  p, c = tonumber(st[2]) or 0, tonumber(st[3]) or 0
elseif sw == ws - w then
  p = tonumber(st[3]) or 0 -- one window on: this window's count is now the previous one
end

-- estimate + 1 <= limit, multiplied through by w to stay in integers:
-- p*(w-e)/w + c + 1 <= limit.
if p * (w - e) + (c + 1) * w <= limit * w then
  c = c + 1
  redis.call('HSET', KEYS[1], 'w', string.format('%d', ws), 'p', string.format('%d', p), 'c', string.format('%d', c))
  -- This window's count weighs on the next one; after that it is gone.
  redis.call('PEXPIRE', KEYS[1], math.max(math.ceil((2 * w - e) / 1000) + 1, keep))
  return {1, math.floor((limit * w - p * (w - e) - c * w) / w), 0, 2 * w - e, 0}
end

-- Rejected: solve estimate(t) + 1 <= limit for the first t >= e.
local t
if c + 1 <= limit then
  t = math.ceil(w * (p - (limit - c - 1)) / p)
else
  t = w + math.ceil(w * (c - (limit - 1)) / c)
end
local reset = 0
if c > 0 then reset = 2 * w - e elseif p > 0 then reset = w - e end
return {0, 0, t - e, reset, 0}
