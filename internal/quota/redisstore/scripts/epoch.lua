-- Read what says whether this Redis still holds what the replicas wrote:
-- the epoch key, set once by the first replica to ask (any value is one
-- no replica has seen, so a Redis that lost it, by a restart without
-- persistence, FLUSHALL or FLUSHDB, gets a new one at once), and the
-- server's run_id (new at every restart, on every replica promoted by a
-- failover, and on a server restored from an RDB).
--
-- KEYS[1]  the epoch key (Store.epochKey)
-- ARGV[1]  the value to set when it is missing: random, from the replica
--
-- Returns {epoch, run_id}.
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1])
  v = ARGV[1]
end
local info = redis.call('INFO', 'server')
return {v, string.match(info, 'run_id:(%x+)') or ''}
