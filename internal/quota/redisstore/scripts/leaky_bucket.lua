-- Take a request's slots of a leaky bucket (traffic shaping), atomically:
-- the request leaves at the first of its slots, the others keep the bucket
-- busy after it. The
-- algorithm, and why one tolerance covers both queue and max_delay, is in
-- internal/quota/leakybucket.go.
--
-- KEYS[1]  the bucket, a hash laid out as bucket_lease.lua's: used =
--          slots taken and not yet drained (a fraction while it drains),
--          ts = when used was computed (µs), iv = µs per slot at that
--          time. bucket_return.lua gives a slot back.
-- ARGV[1]  µs per slot (window / limit; may be fractional)
-- ARGV[2]  tolerance in µs: the longest an admitted request may wait,
--          min(max_delay, queue × interval)
-- ARGV[3]  now in µs for tests; empty: Redis TIME, never a replica's clock
-- ARGV[4]  slots (the cost); 0 decides as for one and takes none
--
-- Returns {allowed, remaining, retry, reset, delay}: 1 or 0; requests that
-- would still be admitted now; µs until one would be when rejected (else
-- 0); µs until the bucket is empty; µs the admitted request must be held
-- until its slot. Times are rounded up: nothing is released early.
local iv = tonumber(ARGV[1])
local tol = tonumber(ARGV[2])
-- Keys expire on Redis' own clock. With injected test time that is not
-- the clock deciding, and a test may run longer than a TTL computed from
-- injected instants: keep such keys a minute at least.
local keep = 0
if tonumber(ARGV[3]) then keep = 60000 end
local now = now_us(ARGV[3])
local n = tonumber(ARGV[4]) or 1

local st = redis.call('HMGET', KEYS[1], 'used', 'ts', 'iv')
local used = tonumber(st[1]) or 0
local ts = tonumber(st[2]) or now
if now > ts then
  used = used - (now - ts) / (tonumber(st[3]) or iv)
  if used < 0 then used = 0 end
  ts = now
end

-- The new request's slot is `used` intervals away. The epsilon (a
-- nanosecond) absorbs float error at the boundary.
local delay = used * iv
if delay <= tol + 0.001 then
  local held = math.ceil(delay - 0.001)
  if n > 0 then
    used = used + n
    redis.call('HSET', KEYS[1], 'used', string.format('%.17g', used), 'ts', string.format('%d', ts), 'iv', ARGV[1])
    redis.call('PEXPIRE', KEYS[1], math.max(math.ceil(used * iv / 1000) + 1, keep))
  else
    held = 0 -- a question is not held
  end
  local ahead = used * iv
  local remaining = 0
  if ahead <= tol + 0.001 then remaining = math.floor((tol - ahead) / iv + 1e-9) + 1 end
  return {1, remaining, 0, math.ceil(ahead), held}
end
return {0, 0, math.ceil(delay - tol - 0.001), math.ceil(delay), 0}
