-- Take a request's cost from a fixed window counter, atomically, all or
-- none: INCRBY with TTL semantics, decided before counting so a rejected
-- request counts nothing.
--
-- KEYS[1]  the counter, a hash: w = start of the window counted (µs, epoch
--          aligned), c = requests admitted in it. Keeping w beside the
--          count means a stale count is never read as the current one,
--          whether or not the key has expired yet (and with injected test
--          time, when Redis' own expiry clock is elsewhere).
-- ARGV[1]  window in µs
-- ARGV[2]  limit
-- ARGV[3]  now in µs for tests; empty: Redis TIME, never a replica's clock
-- ARGV[4]  units (the cost); 0 decides as for one and counts nothing
--
-- Returns {allowed, remaining, retry, reset, delay}: 1 or 0; units left in
-- this window; µs until the window ends when rejected (else 0); µs until
-- the window ends; 0 (no algorithm but the leaky bucket holds requests).
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
local left = ws + w - now

local st = redis.call('HMGET', KEYS[1], 'w', 'c')
local c = 0
if tonumber(st[1]) == ws then c = tonumber(st[2]) or 0 end
if c + spend <= limit then
  if n > 0 then
    c = c + n
    redis.call('HSET', KEYS[1], 'w', string.format('%d', ws), 'c', string.format('%d', c))
    -- The count means nothing once its window is over.
    redis.call('PEXPIRE', KEYS[1], math.max(math.ceil(left / 1000) + 1, keep))
  end
  return {1, limit - c, 0, left, 0}
end
return {0, 0, left, left, 0}
