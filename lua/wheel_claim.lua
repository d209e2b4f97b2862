-- wheel_claim.lua: claims the due entries of one time-wheel shard.
--
-- KEYS[1]  the shard, a sorted set: member = reservation id, score = due time in epoch ms
-- ARGV[1]  most entries to claim
-- ARGV[2]  claim timeout in ms
--
-- Due means score <= the Redis server's clock, so every poller of every instance judges
-- "due" by one clock. A claimed entry is not removed: it is re-scored to now + claim timeout
-- (its lease), which hides it from other pollers while the claimant emits, and lets it fall
-- due again if the claimant dies before emitting. The claimant removes it afterwards with
-- wheel_release.lua. Claiming is one script, so two pollers never claim the same entry at
-- the same time.
--
-- Reply: {lease, id, id, ...}; lease is the score the claimed entries now carry.
local limit = tonumber(ARGV[1])
local timeout = tonumber(ARGV[2])
if limit == nil or limit < 1 or timeout == nil or timeout < 1 then
  error({ err = 'ERR stocksvr: invalid wheel claim arguments' })
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Epoch milliseconds have 13 digits: exact in a double, formatted without an exponent.
local now_s = string.format('%.0f', now)
local lease = string.format('%.0f', now + timeout)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_s, 'LIMIT', 0, limit)
for _, id in ipairs(due) do
  redis.call('ZADD', KEYS[1], 'XX', lease, id)
end
table.insert(due, 1, lease)
return due
