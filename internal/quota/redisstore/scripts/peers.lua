-- Record this replica's heartbeat and count the replicas heard recently.
--
-- KEYS[1]  a sorted set: member = replica id, score = last heartbeat (ms)
-- ARGV[1]  this replica's id
-- ARGV[2]  peer ttl in ms: replicas silent for longer are gone
-- ARGV[3]  now in µs for tests; empty: Redis TIME
-- KEYS[2], ARGV[4]  the epoch key and the value to set when it is
--          missing (epoch.lua): given where both keys live on one server
--          (not on a Cluster), so the heartbeat reads the Redis state in
--          the same call.
--
-- Returns {live replicas, this one included; 1 if this replica's entry was
-- missing (a new replica, a Redis that lost its data, or a silence longer
-- than the ttl), else 0; and, with KEYS[2], the epoch and the run_id}.
local ttl = tonumber(ARGV[2])
local now = math.floor(now_us(ARGV[3]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl))
local added = redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
local n = redis.call('ZCARD', KEYS[1])
if not KEYS[2] then return {n, added} end
local e = redis.call('GET', KEYS[2])
if not e then
  redis.call('SET', KEYS[2], ARGV[4])
  e = ARGV[4]
end
return {n, added, e, string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''}
