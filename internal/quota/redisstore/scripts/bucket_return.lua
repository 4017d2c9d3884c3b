-- Give unspent tokens back to a token bucket: a hybrid slice that idled out
-- or was evicted, a replica shutting down, or a unit refunded because
-- another policy denied the request. A leaky bucket (leaky_bucket.lua)
-- keeps the same {used, ts, iv} layout and gives slots back here too.
--
-- KEYS[1]  the bucket (see bucket_lease.lua)
-- ARGV[1]  tokens returned
-- ARGV[2]  now in µs for tests; empty: Redis TIME
--
-- Returns 1 when the bucket still has state, 0 when it is full (and has
-- been deleted). used never goes below zero: a returned token cannot raise
-- the bucket above its capacity.
local n = tonumber(ARGV[1])
-- Keys expire on Redis' own clock. With injected test time that is not
-- the clock deciding: keep such keys a minute at least.
local keep = 0
if tonumber(ARGV[2]) then keep = 60000 end
local now = now_us(ARGV[2])
local st = redis.call('HMGET', KEYS[1], 'used', 'ts', 'iv')
local used = tonumber(st[1])
local ts = tonumber(st[2])
local iv = tonumber(st[3])
if not used or not ts or not iv then return 0 end
if now > ts then
  used = used - (now - ts) / iv
  ts = now
end
used = used - n
if used <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('HSET', KEYS[1], 'used', string.format('%.17g', used), 'ts', string.format('%d', ts))
redis.call('PEXPIRE', KEYS[1], math.max(math.ceil(used * iv / 1000) + 1, keep))
return 1
