-- Give back units that sliding_log.lua admitted: remove the newest
-- entries. It is the refunded request's own unless another was admitted in
-- between; then the older entry stays, which leaves the window sooner, so
-- no window ever counts more than an exact refund would leave in it.
--
-- KEYS[1]  the log (see sliding_log.lua)
-- ARGV[1]  units given back
-- ARGV[2]… (a late reply's give-back, Store.undoLogLate) the members the
--          take added: those entries are removed by name, and only they
--          (members are unique across replicas), none if the log has
--          lost them since.
--
-- Returns the number of entries removed.
if #ARGV > 1 then
  return redis.call('ZREM', KEYS[1], unpack(ARGV, 2))
end
return #redis.call('ZPOPMAX', KEYS[1], tonumber(ARGV[1]) or 1) / 2
