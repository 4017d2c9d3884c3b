-- Take tokens from a token bucket, atomically: between ARGV[4] and ARGV[3]
-- of them, or none. Redis mode asks for exactly a request's cost; hybrid
-- mode leases a slice of up to ARGV[3], needing at least what the request
-- in hand lacks. ARGV[3] = 0 with ARGV[4] = 1 asks without taking.
--
-- KEYS[1]  the bucket, a hash: used = tokens in use (a fraction while it
--          refills), ts = when used was computed (µs), iv = µs per token
--          at that time. Counting used tokens (small numbers) rather than
--          an instant keeps full double precision: no drift.
-- ARGV[1]  µs per token (window / limit; may be fractional)
-- ARGV[2]  capacity in tokens (burst)
-- ARGV[3]  tokens wanted at most
-- ARGV[4]  tokens needed at least: fewer available grant none
-- ARGV[5]  now in µs for tests; empty: Redis TIME, never a replica's clock
-- ARGV[6]  tokens this replica admitted without Redis (fallback decisions
--          while its master was down), charged before anything is granted,
--          so a bucket that survived the outage (a promoted replica) does
--          not hand them out again. Charged below empty, by one capacity
--          at most: the replicas come back one by one and each charges its
--          debt with its next lease, after the first back may have leased
--          what the bucket refilled meanwhile, so a floor at empty would
--          forgive the later debts (and admit them twice). One capacity
--          bounds what an outage costs afterwards: refill beyond capacity
--          during it was lost to Redis, not spent twice.
--          Empty or 0: none.
--
-- Returns {granted, remaining, wait, full}: tokens granted (fewer than
-- wanted when fewer remain), tokens left in the bucket afterwards, µs until
-- the tokens needed are there when none was granted (else 0), and µs until
-- the bucket is full again. Waits are rounded up so a client never retries
-- early.
local iv = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local now = now_us(ARGV[5])
local debt = tonumber(ARGV[6]) or 0

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

local dirty = false
if debt > 0 then
  used = math.min(used + debt, math.max(used, 2 * cap))
  dirty = true
end

-- The epsilon absorbs float error: 2.9999999999 tokens are 3.
local avail = math.floor(cap - used + 1e-9)
if avail < 0 then avail = 0 end
local granted = 0
if avail >= need then granted = math.min(want, avail) end
if granted > 0 then
  used = used + granted
  dirty = true
end
if dirty then
  redis.call('HSET', KEYS[1], 'used', string.format('%.17g', used), 'ts', string.format('%d', ts), 'iv', ARGV[1])
  -- Once full again the bucket is the same as no bucket: let it go.
  redis.call('PEXPIRE', KEYS[1], math.ceil(used * iv / 1000) + 1)
end
if granted > 0 then
  return {granted, avail - granted, 0, math.ceil(used * iv)}
end
local wait = 0
if avail < need then wait = math.ceil((used - cap + need) * iv) end
return {0, avail, wait, math.ceil(used * iv)}
