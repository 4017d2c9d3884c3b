-- Take a request's cost from a sliding window counter (Cloudflare's
-- weighted two windows), atomically, all or none. The math, and why the wait is exact, is in
-- internal/quota/windows.go.
--
-- KEYS[1]  the counter, a hash: w = start of the window counted (µs, epoch
--          aligned), p = the previous window's count, c = this window's.
-- ARGV[1]  window in µs
-- ARGV[2]  limit
-- ARGV[3]  now in µs for tests; empty: Redis TIME, never a replica's clock
-- ARGV[4]  units (the cost); 0 decides as for one and counts nothing
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
local n = tonumber(ARGV[4]) or 1
local spend = math.max(n, 1)
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

-- estimate + n <= limit, multiplied through by w to stay in integers:
-- p*(w-e)/w + c + n <= limit.
if p * (w - e) + (c + spend) * w <= limit * w then
  local reset = 2 * w - e
  if n > 0 then
    c = c + n
    redis.call('HSET', KEYS[1], 'w', string.format('%d', ws), 'p', string.format('%d', p), 'c', string.format('%d', c))
    -- This window's count weighs on the next one; after that it is gone.
    redis.call('PEXPIRE', KEYS[1], math.max(math.ceil((2 * w - e) / 1000) + 1, keep))
  elseif c == 0 then
    reset = 0
    if p > 0 then reset = w - e end
  end
  return {1, math.floor((limit * w - p * (w - e) - c * w) / w), 0, reset, 0}
end

-- Rejected: solve estimate(t) + n <= limit for the first t >= e.
local t
if spend > limit then
  t = 2 * w -- never fits: until both windows' counts are gone
elseif c + spend <= limit then
  t = math.ceil(w * (p - (limit - c - spend)) / p)
else
  t = w + math.ceil(w * (c - (limit - spend)) / c)
end
local reset = 0
if c > 0 then reset = 2 * w - e elseif p > 0 then reset = w - e end
return {0, 0, t - e, reset, 0}
