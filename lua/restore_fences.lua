-- restore_fences.lua: re-create the fences of a lost bucket's reservations, and the op records
-- of the steps MySQL says they took, before the rebuild creates the stock hash (docs/design.md, rebuild).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1..F]     fence hashes           KEYS[F+1..F+R] op records
-- ARGV[1] op TTL ms   ARGV[2] version the rebuilt bucket starts at   ARGV[3] F (fence count)
-- then 8 values per fence: reservation_id, phase (RESERVED|CONFIRMED|CANCELED|REFUNDED),
--   quantity, refunded, try_op, confirm_op, cancel_op, last_refund_op ('' for none)
-- then 4 values per op record: reservation_id, action (TRY|CONFIRM|CANCEL|REFUND), phase the
--   step left, quantity
--
-- A fence or op record that exists is left as it is: it was written after the loss (while the
-- stock hash is missing the only writer is the empty rollback of a never-built bucket) and
-- is newer than MySQL's view. Returns the number of fences written.
--
-- With the fences back, a retried Try is recognised as done (try_op), a Confirm, Cancel or
-- Refund applies once (its op id or the phase), and an empty rollback keeps fencing its late
-- Try. Until the stock hash exists every step still answers BUCKET_MISSING.
local ttl = arg_int(1, 'op ttl', 1)
local version = arg_int(2, 'version', 0)
local fences = arg_int(3, 'fence count', 0)
local ops = #KEYS - fences
if ops < 0 or #ARGV ~= 3 + 8 * fences + 4 * ops then
  fail('restore_fences: ' .. #KEYS .. ' keys, ' .. fences .. ' fences and ' .. #ARGV ..
       ' values do not match')
end
local phases = { RESERVED = true, CONFIRMED = true, CANCELED = true, REFUNDED = true }
local actions = { TRY = true, CONFIRM = true, CANCEL = true, REFUND = true }
for i = 0, fences - 1 do
  local a = 3 + i * 8
  if not phases[ARGV[a + 2]] then
    fail('restore_fences: invalid phase ' .. tostring(ARGV[a + 2]))
  end
  arg_int(a + 3, 'quantity', 1)
  arg_int(a + 4, 'refunded', 0)
end
for i = 0, ops - 1 do
  local a = 3 + 8 * fences + i * 4
  if not actions[ARGV[a + 2]] or not phases[ARGV[a + 3]] then
    fail('restore_fences: invalid action or phase for an op record')
  end
  arg_int(a + 4, 'quantity', 0)
end

local now = now_ms()
local written = 0
local names = { 'try_op', 'confirm_op', 'cancel_op', 'last_refund_op' }
for i = 0, fences - 1 do
  local a = 3 + i * 8
  local key = KEYS[i + 1]
  if redis.call('EXISTS', key) == 0 then
    local fields = { 'quantity', ARGV[a + 3], 'refunded', ARGV[a + 4], 'restored', 1 }
    for k = 1, 4 do
      if ARGV[a + 4 + k] ~= '' then
        fields[#fields + 1] = names[k]
        fields[#fields + 1] = ARGV[a + 4 + k]
      end
    end
    write_fence(key, ARGV[a + 2], fields, version, now, ttl)
    written = written + 1
  end
end
for i = 0, ops - 1 do
  local a = 3 + 8 * fences + i * 4
  local key = KEYS[fences + i + 1]
  if redis.call('EXISTS', key) == 0 then
    redis.call('HSET', key, 'action', ARGV[a + 2], 'reservation_id', ARGV[a + 1],
      'code', 'SUCCEEDED', 'version', version, 'total', 0, 'available', 0, 'reserved', 0,
      'sold', 0, 'phase', ARGV[a + 3], 'empty_rollback', 0, 'deficit', 0, 'paid', 0,
      'quantity', ARGV[a + 4], 'operated_at', now, 'restored', 1)
    redis.call('PEXPIRE', key, ttl)
  end
end
return written
