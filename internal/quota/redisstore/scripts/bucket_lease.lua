-- Take tokens from a token bucket, atomically: between ARGV[4] and ARGV[3]
-- of them, or none. Redis mode asks for exactly a request's cost; hybrid
-- mode leases a slice of up to ARGV[3], needing at least the request's
-- cost, and retires the replica's previous lease of the key in the same
-- call. ARGV[3] = 0 with ARGV[4] = 1 asks without taking.
--
-- KEYS[1]  the bucket (bucket_state.lua)
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
-- ARGV[7]  lease life in ms: the grant is a lease, counted out until then
--          (rounded up to the grain, a quarter of the life). Empty or 0:
--          an exact take, spent at once and never counted out.
-- ARGV[8]  replicas sharing the bucket: a lease takes at most half of
--          what is available divided by them, but never less than needed,
--          so slices shrink to the request's cost as the bucket drains.
-- ARGV[9], ARGV[10], ARGV[11]  the lease this call retires: its expiry
--          (ms, as this script returned it), tokens it counted out, tokens
--          unspent. Empty or 0: none.
-- ARGV[12] tokens of the grant the request in hand spends at once: an
--          admission now, never counted out. Near the limit a grant is
--          just the request's cost, so nothing is out and the take is as
--          exact as redis mode's.
-- ARGV[13] 1: a charge (charge: always): exactly ARGV[3] tokens, granted
--          whatever is left, the level going below empty into debt that
--          refill pays back before anything is granted again. A charge is
--          spent at once (ARGV[12] = ARGV[3]), never leased: the bound in
--          bucket_state.lua is about what leases hand out, and a charge
--          hands out nothing; it only lowers the level. Empty: a take.
-- ARGV[14] block_for in µs (the penalty box): a take or question this
--          call denies puts the key in its box until now + ARGV[14] (the
--          field b), and every call until then grants nothing (charges
--          excepted: they record units already served) and answers the
--          block's end as both waits, the count left as it is. Denials
--          during a block do not extend it. Empty or 0: no block is set;
--          one already set is honoured all the same.
--
-- ARGV[15], ARGV[16], ARGV[17]  the retired lease's key state (k, g, as
--          this script returned them; empty or 0 when the lease has ended on
--          the replica: nothing to check) and what to charge when this
--          Redis does not hold that grant (bucket_state.lua, bucket_retire).
-- ARGV[18], ARGV[19], KEYS[2]  what of ARGV[17] was spent since the
--          replica's last heartbeat that found the store unchanged, and the
--          epoch it found: when the epoch key (KEYS[2]) holds another, the
--          whole store was lost since, and only ARGV[18] is charged
--          (bucket_owed). No KEYS[2]: ARGV[17].
--
-- In hybrid mode a block stops the grants, not the spending of leases
-- granted before it: those replicas may still admit what they hold, at
-- most the tokens out on leases when the block began. Near the limit the
-- slices have shrunk to about the request's cost (ARGV[8]), so that is
-- about one request per replica.
--
-- Returns {granted, remaining, wait, full, expiry, k, g, forgot}: tokens granted (fewer
-- than wanted when fewer remain), tokens left in the bucket afterwards,
-- µs until the tokens needed are there when none was granted (else 0), µs
-- until the bucket is full again (as if every lease were given back), the lease's expiry in ms (0 when
-- nothing is counted out), the key state the lease is counted under (k,
-- g; 0 when nothing is counted out), and 1 when the retired lease was one
-- this Redis had forgotten (else 0). Waits are rounded up so a client
-- never retries early.
local iv = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local need = tonumber(ARGV[4])
local keep = 0
if tonumber(ARGV[5]) then keep = 60000 end
local now = now_us(ARGV[5])
local debt = tonumber(ARGV[6]) or 0
local life = tonumber(ARGV[7]) or 0
local peers = tonumber(ARGV[8]) or 0
local spent = tonumber(ARGV[12]) or 0
local charge = ARGV[13] == '1' and want > 0
local block_for = tonumber(ARGV[14]) or 0

local b = bucket_load(KEYS[1], iv, now)
-- Refill at the rate in force since ts (bucket_load); from now on, this
-- call's. A reload that changes the rate keeps the tokens in use, not the
-- time they take to come back.
b.iv = iv
local forgot = 0
if bucket_retire(KEYS[1], b, tonumber(ARGV[9]), tonumber(ARGV[10]) or 0, tonumber(ARGV[11]) or 0,
    tonumber(ARGV[15]), tonumber(ARGV[16]), bucket_owed(KEYS[2], ARGV[17], ARGV[18], ARGV[19])) then
  forgot = 1
end

if debt > 0 then
  b.used = math.min(b.used + debt, math.max(b.used, 2 * cap))
  b.dirty = true
end

if b.block > now and not charge then
  if b.dirty then bucket_save(KEYS[1], b, now, keep) end
  local left = b.block - now
  return {0, 0, left, left, 0, 0, 0, forgot}
end

-- The epsilon absorbs float error: 2.9999999999 tokens are 3.
local avail = math.floor(cap - b.used + 1e-9)
if avail < 0 then avail = 0 end
if avail < need and block_for > 0 and not charge then
  b.block = now + block_for
  bucket_save(KEYS[1], b, now, keep)
  return {0, 0, block_for, block_for, 0, 0, 0, forgot}
end
local granted = 0
if charge then
  granted = want
elseif avail >= need then
  granted = math.min(want, avail)
  if peers > 0 then granted = math.min(granted, math.max(need, math.floor(avail / (2 * peers)))) end
end
local expiry, k, g = 0, 0, 0
if granted > 0 then
  b.used = b.used + granted
  b.dirty = true
  local held = granted - math.min(spent, granted)
  if life > 0 and held > 0 then
    local grain = math.max(math.ceil(life / 4), 1)
    expiry = math.ceil((math.floor(now / 1000) + life) / grain) * grain
    redis.call('HINCRBY', KEYS[1], 'x' .. string.format('%d', expiry), held)
    b.out = b.out + held
    b.last = math.max(b.last, expiry * 1000)
    k, g = bucket_count_lease(KEYS[1], b)
  end
end
if b.dirty then bucket_save(KEYS[1], b, now, keep) end
-- Full again once what was spent refills: tokens out on leases would be
-- given back, not refilled.
local full = math.ceil(math.max(b.used - b.out, 0) * iv)
if granted > 0 then
  -- In debt after a charge: 0 left, never a negative count.
  return {granted, math.max(avail - granted, 0), 0, full, expiry, k, g, forgot}
end
local wait = 0
if avail < need then
  wait = math.ceil((b.used - cap + need) * iv)
  -- Tokens out on leases come back only as the leases end.
  if b.out > cap - need and b.last > now then wait = math.max(wait, b.last - now) end
end
return {0, avail, wait, full, 0, 0, 0, forgot}
