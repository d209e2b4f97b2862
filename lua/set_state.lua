-- set_state.lua: move a bucket along OPEN -> CLOSED -> ARCHIVED (docs/design.md, bucket lifecycle).
-- Runs after _common.lua (prepended by lua.rs).
--
-- KEYS[1] stock hash   KEYS[2] op record
-- ARGV[1] operation_id   ARGV[2] OPEN|CLOSED|ARCHIVED   ARGV[3] expire seconds for ARCHIVED
-- (0 = keep the key)   ARGV[4] op TTL ms
--
-- Outcomes:
--   replay of the operation id   -> the stored first result, replayed=1
--   no stock hash                -> BUCKET_MISSING, nothing recorded
--   same state                   -> SUCCEEDED, no change
--   backwards (e.g. CLOSED -> OPEN) -> CONFLICT: the lifecycle is one-way, and reopening a
--                                   closed day would let Trys into a bucket new orders left
--   ARCHIVED while reserved > 0  -> CONFLICT: reservations still hold stock here; archiving
--                                   waits until they are all finished
--   otherwise                    -> state set, version bumped (the snapshot follows the state),
--                                   and on ARCHIVED the stock key gets ARGV[3] seconds to live
-- Everything except a replay or a missing bucket is recorded.
local op = arg_str(1, 'operation_id')
local state = arg_str(2, 'state')
local rank = { OPEN = 1, CLOSED = 2, ARCHIVED = 3 }
if rank[state] == nil then
  fail('invalid state: ' .. state)
end
local expire_secs = arg_int(3, 'expire seconds', 0)
local ttl = arg_int(4, 'op ttl', 1)

local prev = replay(KEYS[2], 'SET_STATE', '')
if prev then
  return prev
end

local s = read_stock(KEYS[1])
if not s then
  return result('BUCKET_MISSING', ZERO, '', false, false)
end

local now = now_ms()
local code = 'SUCCEEDED'
if s.state == state then
  code = 'SUCCEEDED'
elseif (rank[s.state] or 0) > rank[state] then
  code = 'CONFLICT'
elseif state == 'ARCHIVED' and s.reserved > 0 then
  code = 'CONFLICT'
else
  s.state = state
  write_stock(KEYS[1], s, now)
  redis.call('HSET', KEYS[1], 'state', state)
  if state == 'ARCHIVED' and expire_secs > 0 then
    redis.call('EXPIRE', KEYS[1], expire_secs)
  end
end
return record(KEYS[2], ttl, 'SET_STATE', '', 0, result(code, s, '', false, false), now)
