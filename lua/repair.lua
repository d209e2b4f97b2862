-- repair.lua: write a bucket's corrected numbers (docs/design.md, repair) or rebuild a lost bucket (rebuild).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash   KEYS[2] op record
-- ARGV[1] operation_id   ARGV[2] REPAIR|REBUILD   ARGV[3] version: REPAIR the version the
-- numbers were computed against, REBUILD the version the rebuilt bucket starts at
-- ARGV[4] total  ARGV[5] available  ARGV[6] reserved  ARGV[7] sold  ARGV[8] deficit (all >= 0)
-- ARGV[9] state (OPEN|CLOSED) for REBUILD, '' for REPAIR   ARGV[10] baseline_version (>= 0)
-- ARGV[11] op TTL ms
-- ARGV[12] REPAIR only, optional: the least version the repaired bucket gets (0/absent: the
-- usual +1). After a failover lost acknowledged writes, Redis' version is behind the versions
-- MySQL booked; the repair moves it past them so the projector takes the repaired numbers
-- (it keeps only newer versions) and no later operation reuses a booked version.
--
-- Never `SET available = expected` blindly: the numbers were computed from MySQL while Trys
-- may have run since, so a REPAIR writes them only if the bucket is still at the version they
-- were computed against.
--
-- Outcomes:
--   replay of the operation id           -> the stored first result, replayed=1
--   REPAIR, no stock hash                -> BUCKET_MISSING, nothing recorded (a lost bucket
--                                           is rebuilt, not repaired)
--   REPAIR, version differs from ARGV[3] -> CONFLICT, recorded: something ran since; the
--                                           caller recomputes and repairs under a new id
--   REPAIR                               -> the five numbers written, version bumped, SUCCEEDED
--   REBUILD, a stock hash exists         -> CONFLICT, recorded: a bucket that exists is
--                                           repaired, never rebuilt over
--   REBUILD                              -> the hash created with the numbers, state, baseline
--                                           version and version ARGV[3], SUCCEEDED
-- The numbers must satisfy available + reserved + sold = total + deficit with available or
-- deficit 0; anything else is refused before a write.
local op = arg_str(1, 'operation_id')
local mode = arg_str(2, 'mode')
if mode ~= 'REPAIR' and mode ~= 'REBUILD' then
  fail('invalid mode: ' .. mode)
end
local version = arg_int(3, 'version', 0)
local n = {
  total = arg_int(4, 'total', 0),
  available = arg_int(5, 'available', 0),
  reserved = arg_int(6, 'reserved', 0),
  sold = arg_int(7, 'sold', 0),
  deficit = arg_int(8, 'deficit', 0),
}
local state = ARGV[9] or ''
local baseline = arg_int(10, 'baseline_version', 0)
local ttl = arg_int(11, 'op ttl', 1)
local floor = 0
if ARGV[12] ~= nil and ARGV[12] ~= '' then
  floor = arg_int(12, 'min version', 0)
end
if n.available + n.reserved + n.sold ~= n.total + n.deficit
    or (n.available > 0 and n.deficit > 0) then
  fail('inconsistent numbers: total=' .. n.total .. ' available=' .. n.available ..
       ' reserved=' .. n.reserved .. ' sold=' .. n.sold .. ' deficit=' .. n.deficit)
end
if mode == 'REBUILD' and state ~= 'OPEN' and state ~= 'CLOSED' then
  fail('invalid state for a rebuild: ' .. state)
end

local prev = replay(KEYS[2], mode, '')
if prev then
  return prev
end

local s = read_stock(KEYS[1])
local now = now_ms()
if mode == 'REPAIR' then
  if not s then
    return result('BUCKET_MISSING', ZERO, '', false, false)
  end
  if s.version ~= version then
    return record(KEYS[2], ttl, mode, '', 0, result('CONFLICT', s, '', false, false), now)
  end
  s.total, s.available, s.reserved, s.sold, s.deficit = n.total, n.available, n.reserved, n.sold,
    n.deficit
  write_stock(KEYS[1], s, now)
  if s.version < floor then
    redis.call('HSET', KEYS[1], 'version', floor)
    s.version = floor
  end
  return record(KEYS[2], ttl, mode, '', 0, result('SUCCEEDED', s, '', false, false), now)
end

if s then
  return record(KEYS[2], ttl, mode, '', 0, result('CONFLICT', s, '', false, false), now)
end
redis.call('HSET', KEYS[1],
  'total', n.total, 'available', n.available, 'reserved', n.reserved, 'sold', n.sold,
  'deficit', n.deficit, 'version', version, 'state', state, 'baseline_version', baseline,
  'updated_at', now)
s = { total = n.total, available = n.available, reserved = n.reserved, sold = n.sold,
      deficit = n.deficit, version = version, state = state, baseline_version = baseline }
return record(KEYS[2], ttl, mode, '', 0, result('SUCCEEDED', s, '', false, false), now)
