-- refund.lua: give back part or all of a reservation (reserved or sold -> available).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash   KEYS[2] fence hash   KEYS[3] op record
-- ARGV[1] reservation_id   ARGV[2] operation_id   ARGV[3] quantity (>= 1)   ARGV[4] op TTL ms
--
-- Outcomes:
--   replay of the operation id             -> the stored first result, replayed=1
--   fence shows this op as its last Refund -> SUCCEEDED, replayed=1 (op record expired)
--   no stock hash                          -> BUCKET_MISSING, nothing recorded (checked before
--                                             the fence: a lost bucket lost its fences too)
--   fence NONE/CANCELED/REFUNDED           -> CONFLICT, recorded (nothing to give back)
--   quantity > fence quantity - refunded   -> OVER_REFUND, recorded, no change
--   fence RESERVED  -> reserved -= q (a scheduled order refunded before its confirm time)
--   fence CONFIRMED -> sold -= q
--   then available += q (paying a deficit first), refunded += q; the phase becomes REFUNDED only
--   once refunded == quantity, so partial refunds keep RESERVED/CONFIRMED and add up. A later
--   Confirm of a partly refunded RESERVED fence sells only quantity - refunded.
local reservation_id = arg_str(1, 'reservation_id')
local op = arg_str(2, 'operation_id')
local qty = arg_int(3, 'quantity', 1)
local ttl = arg_int(4, 'op ttl', 1)

local prev = replay(KEYS[3], 'REFUND', reservation_id)
if prev then
  return prev
end

local f = read_fence(KEYS[2])
local s = read_stock(KEYS[1])
if f.last_refund_op == op then
  return result('SUCCEEDED', s or ZERO, phase_out(f), false, true)
end

if not s then
  return result('BUCKET_MISSING', ZERO, phase_out(f), false, false)
end

local now = now_ms()
if f.phase ~= 'RESERVED' and f.phase ~= 'CONFIRMED' then
  return record(KEYS[3], ttl, 'REFUND', reservation_id, qty,
                result('CONFLICT', s, phase_out(f), false, false), now)
end
if qty > f.quantity - f.refunded then
  return record(KEYS[3], ttl, 'REFUND', reservation_id, qty,
                result('OVER_REFUND', s, f.phase, false, false), now)
end

if f.phase == 'RESERVED' then
  s.reserved = s.reserved - qty
else
  s.sold = s.sold - qty
end
local paid = release(s, qty)
check_stock(s)
local refunded = f.refunded + qty
local phase = f.phase
if refunded == f.quantity then
  phase = 'REFUNDED'
end
write_stock(KEYS[1], s, now)
write_fence(KEYS[2], phase, { 'refunded', refunded, 'last_refund_op', op }, s.version, now, ttl)
return record(KEYS[3], ttl, 'REFUND', reservation_id, qty,
              result('SUCCEEDED', s, phase, false, false, paid), now)
