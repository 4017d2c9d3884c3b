-- Prepended to the fixed-window scripts (fixed_window.lua and
-- calendar_window.lua): the count of one window, taken atomically, all or
-- none, decided before counting so a rejected request counts nothing.
--
-- key is a hash: w = start of the window counted (µs), c = units admitted
-- in it. Keeping w beside the count means a stale count is never read as
-- the current one, whether or not the key has expired yet (and with
-- injected test time, when Redis' own expiry clock is elsewhere). The
-- window is [ws, we); between need and want units are taken (want 0
-- with need 1 decides as for one and counts nothing); keep is the least
-- TTL in ms.
--
-- Hybrid mode leases a count: peers > 0 caps the take at half of what is
-- left over the replicas sharing the window (never below need), and back
-- units of a lease in the window starting at back_ws, not spent, are
-- given back first. A lease dies with its window, so a count leased in
-- one is never spent in the next: the window's count, leases included,
-- never passes its limit (but by charges, below).
--
-- charge (charge: always) counts want units whatever the count: it may
-- pass the limit, and the window's end forgives what went past it.
--
-- block (block_for, µs; 0: none) is the penalty box: a take or question
-- denied here puts the key in its box until now + block (the field b), and
-- until then every take and question is denied with the block's end as
-- both waits, the count left as it is; charges are still counted (they
-- record units already served). Denials during a block do not extend it.
-- A block already set is honoured whatever block says. A hybrid lease
-- granted before the block may still be spent by its replica: at most
-- what was leased, half of what was left over the replicas, about the
-- request's cost near the limit.
--
-- reserve (units) is held out of the window's room: a replica that
-- decided this window by its fallback while Redis was out of its reach
-- asks Redis again only for what is left once its own fallback
-- admissions and what the other replicas' fallbacks may have admitted in
-- the same window are set aside (Redis never counted either).
--
-- Returns {allowed, remaining, retry, reset, delay, granted, ws, left}: 1
-- or 0; units left in this window; µs until the window ends when rejected
-- (else 0); µs until the window ends; 0 (no algorithm but the leaky bucket
-- holds requests); units taken; the window's start (µs), the lease's name;
-- µs until it ends, the lease's life.
local function window_take(key, ws, we, now, want, need, limit, keep, peers, back_ws, back, charge, block, reserve)
  local left = we - now
  local st = redis.call('HMGET', key, 'w', 'c', 'b')
  local c = 0
  if tonumber(st[1]) == ws then c = tonumber(st[2]) or 0 end
  local until_ = tonumber(st[3]) or 0
  -- The key lives as long as its window's count or its block, the later.
  local function expire()
    local ms = math.ceil(left / 1000) + 1
    if until_ > now then ms = math.max(ms, math.ceil((until_ - now) / 1000) + 1) end
    redis.call('PEXPIRE', key, math.max(ms, keep))
  end
  local dirty = false
  if back > 0 and back_ws == ws and c > 0 then
    c = math.max(c - back, 0)
    dirty = true
  end
  local granted = 0
  local room = limit - c - reserve
  local charging = charge and want > 0
  if not charging and (until_ > now or (room < need and block > 0)) then
    if until_ <= now then
      until_ = now + block
      dirty = true
    end
    if dirty then
      redis.call('HSET', key, 'w', string.format('%d', ws), 'c', string.format('%d', c), 'b', string.format('%d', until_))
      expire()
    end
    return {0, 0, until_ - now, until_ - now, 0, 0, ws, left}
  end
  if charging then
    granted = want
    c = c + want
    dirty = true
  elseif room >= need then
    granted = want
    if peers > 0 then granted = math.min(want, math.max(need, math.floor(room / (2 * peers)))) end
    c = c + granted
    dirty = dirty or granted > 0
  end
  if dirty then
    redis.call('HSET', key, 'w', string.format('%d', ws), 'c', string.format('%d', c))
    -- The count means nothing once its window is over.
    expire()
  end
  if granted > 0 or room >= need then return {1, math.max(limit - c - reserve, 0), 0, left, 0, granted, ws, left} end
  return {0, 0, left, left, 0, 0, ws, left}
end
