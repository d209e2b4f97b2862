-- confirm.lua: turn a reservation's hold into a sale (reserved -> sold).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash   KEYS[2] fence hash   KEYS[3] op record
-- ARGV[1] reservation_id   ARGV[2] operation_id   ARGV[3] op TTL ms
--
-- Outcomes:
--   replay of the operation id          -> the stored first result, replayed=1
--   fence shows this op as its Confirm  -> SUCCEEDED, replayed=1 (op record expired)
--   no stock hash                       -> BUCKET_MISSING, nothing recorded (checked before the
--                                          fence: a lost bucket lost its fences too)
--   fence not RESERVED (NONE, CANCELED, REFUNDED, or CONFIRMED by another operation id)
--                                       -> CONFLICT, recorded. A second Confirm with a new id is
--                                          not an idempotent success: replays reuse the id (and
--                                          hit the op record), so a new id means the MySQL CAS
--                                          was bypassed and must be looked at.
--   otherwise                           -> moves quantity - refunded from reserved to sold,
--                                          fence CONFIRMED. Allowed in any bucket state: CLOSED
--                                          only stops new Trys (docs/design.md, bucket lifecycle).
local reservation_id = arg_str(1, 'reservation_id')
local op = arg_str(2, 'operation_id')
local ttl = arg_int(3, 'op ttl', 1)

local prev = replay(KEYS[3], 'CONFIRM', reservation_id)
if prev then
  return prev
end

local f = read_fence(KEYS[2])
local s = read_stock(KEYS[1])
if f.confirm_op == op then
  return result('SUCCEEDED', s or ZERO, phase_out(f), false, true)
end

if not s then
  return result('BUCKET_MISSING', ZERO, phase_out(f), false, false)
end

local now = now_ms()
if f.phase ~= 'RESERVED' then
  return record(KEYS[3], ttl, 'CONFIRM', reservation_id, 0,
                result('CONFLICT', s, phase_out(f), false, false), now)
end

local held = f.quantity - f.refunded
s.reserved = s.reserved - held
s.sold = s.sold + held
check_stock(s)
write_stock(KEYS[1], s, now)
write_fence(KEYS[2], 'CONFIRMED', { 'confirm_op', op }, s.version, now, ttl)
return record(KEYS[3], ttl, 'CONFIRM', reservation_id, held,
              result('SUCCEEDED', s, 'CONFIRMED', false, false), now)
