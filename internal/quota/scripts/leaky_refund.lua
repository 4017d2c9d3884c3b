-- Give back one slot that leaky_bucket.lua admitted, because another
-- policy denied the request or its caller gave up while held.
--
-- KEYS[1]  the bucket (see leaky_bucket.lua)
-- ARGV[1]  now in µs for tests; empty: Redis TIME
--
-- Returns 1 when the bucket still has state, 0 when it is empty (and has
-- been deleted). used never goes below zero: a refund cannot make a slot
-- in the past.
-- Keys expire on Redis' own clock. With injected test time that is not
-- the clock deciding: keep such keys a minute at least.
local keep = 0
if tonumber(ARGV[1]) then keep = 60000 end
local now = now_us(ARGV[1])
local st = redis.call('HMGET', KEYS[1], 'used', 'ts', 'iv')
local used = tonumber(st[1])
local ts = tonumber(st[2])
local iv = tonumber(st[3])
if not used or not ts or not iv then return 0 end
if now > ts then
  used = used - (now - ts) / iv
  ts = now
end
used = used - 1
if used <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('HSET', KEYS[1], 'used', string.format('%.17g', used), 'ts', string.format('%d', ts))
redis.call('PEXPIRE', KEYS[1], math.max(math.ceil(used * iv / 1000) + 1, keep))
return 1
