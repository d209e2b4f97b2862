-- adjust.lua: a merchant (or a repair) sets a new total for a live bucket (docs/design.md, adjustments and deficit).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash   KEYS[2] op record
-- ARGV[1] operation_id   ARGV[2] new_total (>= 0)   ARGV[3] expected version or '' for none
-- ARGV[4] baseline_version (>= 0)   ARGV[5] op TTL ms
--
-- Outcomes:
--   replay of the operation id             -> the stored first result, replayed=1
--   no stock hash                          -> BUCKET_MISSING, nothing recorded
--   state ARCHIVED                         -> BUCKET_CLOSED, nothing recorded (CLOSED buckets can
--                                             still be adjusted: repairs run after the day ends)
--   expected version given and different   -> CONFLICT, recorded (a CAS that lost: the caller
--                                             re-reads and retries with a new operation id)
--   ARGV baseline_version < stored one     -> CONFLICT, recorded (a stale adjust arriving late)
--   no expected version and ARGV baseline_version = stored one
--                                          -> CONFLICT, recorded: a merchant adjust always carries
--                                             a new baseline version, so an equal one means the
--                                             bucket was already built from that baseline (an init
--                                             that read it first) and applying again would book
--                                             the change twice. A repair (expected version given)
--                                             may keep the baseline version: its CAS guards it.
--   otherwise total = new_total, available = max(0, new_total - reserved - sold),
--             deficit = max(0, reserved + sold - new_total), baseline_version = ARGV value.
--             Accepted orders are never undone to fit a smaller total: the deficit is reported
--             and paid down by later cancels and refunds.
local op = arg_str(1, 'operation_id')
local new_total = arg_int(2, 'new_total', 0)
local expected = nil
if ARGV[3] ~= nil and ARGV[3] ~= '' then
  expected = arg_int(3, 'expected_version', 0)
end
local baseline = arg_int(4, 'baseline_version', 0)
local ttl = arg_int(5, 'op ttl', 1)

local prev = replay(KEYS[2], 'ADJUST', '')
if prev then
  return prev
end

local s = read_stock(KEYS[1])
if not s then
  return result('BUCKET_MISSING', ZERO, '', false, false)
end
if s.state == 'ARCHIVED' then
  return result('BUCKET_CLOSED', s, '', false, false)
end

local now = now_ms()
if (expected ~= nil and expected ~= s.version) or baseline < s.baseline_version
    or (expected == nil and baseline == s.baseline_version) then
  return record(KEYS[2], ttl, 'ADJUST', '', new_total, result('CONFLICT', s, '', false, false), now)
end

local committed = s.reserved + s.sold
s.total = new_total
s.available = math.max(0, new_total - committed)
s.deficit = math.max(0, committed - new_total)
check_stock(s)
write_stock(KEYS[1], s, now)
redis.call('HSET', KEYS[1], 'baseline_version', baseline)
return record(KEYS[2], ttl, 'ADJUST', '', new_total, result('SUCCEEDED', s, '', false, false), now)
