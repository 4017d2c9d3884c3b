-- Reset a partition's counts: delete every key holding them (one per
-- algorithm, and the calendar window's), all in the partition's hash tag,
-- so one Cluster slot. The counters API's reset, never a decision.
--
-- KEYS     the partition's keys
--
-- Returns the number of keys deleted.
return redis.call('DEL', unpack(KEYS))
