-- Give tokens back to a token bucket: a hybrid lease retired (idle,
-- evicted, a replica shutting down), or units refunded because another
-- policy denied the request. A leaky bucket (leaky_bucket.lua) keeps the
-- same {used, ts, iv} layout and gives slots back here too.
--
-- KEYS[1]  the bucket (bucket_state.lua)
-- ARGV[1]  tokens returned (unspent)
-- ARGV[2]  now in µs for tests; empty: Redis TIME
-- ARGV[3], ARGV[4]  the lease retired: its expiry (ms) and tokens granted.
--          Empty or 0: plain tokens, no lease.
-- ARGV[5], ARGV[6], ARGV[7]  the lease's key state (k, g) and what to
--          charge when this Redis does not hold its grant, as in
--          bucket_lease.lua. Empty: nothing to check.
-- ARGV[8], ARGV[9], KEYS[2]  as ARGV[18], ARGV[19] and KEYS[2] of
--          bucket_lease.lua.
--
-- Returns {1 when the bucket still has state, 0 when it is full (and has
-- been deleted); 1 when the lease named was one this Redis had forgotten,
-- 2 when the whole key was gone (nothing given back, nothing charged: a
-- bucket cannot be made without its limit), else 0}. A returned token
-- never lifts the level above capacity − the tokens still out on leases.
local keep = 0
if tonumber(ARGV[2]) then keep = 60000 end
local now = now_us(ARGV[2])
local b = bucket_load(KEYS[1], nil, now)
local named = (tonumber(ARGV[5]) or 0) > 0 and (tonumber(ARGV[3]) or 0) > 0
if not b then
  if named then return {0, 2} end
  return {0, 0}
end
local forgot = 0
if bucket_retire(KEYS[1], b, tonumber(ARGV[3]), tonumber(ARGV[4]) or 0, tonumber(ARGV[1]) or 0,
    tonumber(ARGV[5]), tonumber(ARGV[6]), bucket_owed(KEYS[2], ARGV[7], ARGV[8], ARGV[9])) then
  forgot = 1
end
bucket_save(KEYS[1], b, now, keep)
if b.used <= 1e-9 and b.out <= 0 then return {0, forgot} end
return {1, forgot}
