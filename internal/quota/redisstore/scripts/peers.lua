-- Record this replica's heartbeat and count the replicas heard recently.
--
-- KEYS[1]  a sorted set: member = replica id, score = last heartbeat (ms)
-- ARGV[1]  this replica's id
-- ARGV[2]  peer ttl in ms: replicas silent for longer are gone
-- ARGV[3]  now in µs for tests; empty: Redis TIME
--
-- Returns {live replicas, this one included; 1 if this replica's entry was
-- missing (a new replica, a Redis that lost its data, or a silence longer
-- than the ttl), else 0}.
local ttl = tonumber(ARGV[2])
local now = math.floor(now_us(ARGV[3]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - ttl))
local added = redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return {redis.call('ZCARD', KEYS[1]), added}
