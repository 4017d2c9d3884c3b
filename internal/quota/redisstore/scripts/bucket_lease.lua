-- Take up to ARGV[3] tokens from a token bucket, atomically. Redis mode
-- asks for one token per decision; hybrid mode leases a slice.
--
-- KEYS[1]  the bucket, a hash: used = tokens in use (a fraction while it
--          refills), ts = when used was computed (µs), iv = µs per token
--          at that time. Counting used tokens (small numbers) rather than
--          an instant keeps full double precision: no drift.
-- ARGV[1]  µs per token (window / limit; may be fractional)
-- ARGV[2]  capacity in tokens (burst)
-- ARGV[3]  tokens wanted, at least 1
-- ARGV[4]  now in µs for tests; empty: Redis TIME, never a replica's clock
--
-- Returns {granted, remaining, wait, full}: tokens granted (fewer than
-- wanted when fewer remain), tokens left in the bucket afterwards, µs until
-- the next token when none was granted (else 0), and µs until the bucket
-- is full again. Waits are rounded up so a client never retries early.
local iv = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local now = now_us(ARGV[4])

local st = redis.call('HMGET', KEYS[1], 'used', 'ts', 'iv')
local used = tonumber(st[1]) or 0
local ts = tonumber(st[2]) or now
-- Refill at the rate in force since ts. A reload that changes the rate
-- keeps the tokens in use, not the time they take to come back.
if now > ts then
  used = used - (now - ts) / (tonumber(st[3]) or iv)
  if used < 0 then used = 0 end
  ts = now
end

-- The epsilon absorbs float error: 2.9999999999 tokens are 3.
local avail = math.floor(cap - used + 1e-9)
if avail < 0 then avail = 0 end
local granted = math.min(want, avail)
if granted > 0 then
  used = used + granted
  redis.call('HSET', KEYS[1], 'used', string.format('%.17g', used), 'ts', string.format('%d', ts), 'iv', ARGV[1])
  -- Once full again the bucket is the same as no bucket: let it go.
  redis.call('PEXPIRE', KEYS[1], math.ceil(used * iv / 1000) + 1)
  return {granted, avail - granted, 0, math.ceil(used * iv)}
end
return {0, 0, math.ceil((used - cap + 1) * iv), math.ceil(used * iv)}
