-- wheel_release.lua: removes a fired entry from its time-wheel shard.
--
-- KEYS[1]  the shard
-- ARGV[1]  reservation id
-- ARGV[2]  the lease score wheel_claim.lua gave the entry
--
-- Only while the entry still carries this claim's lease: if the claim timed out and another
-- poller claimed it again, that poller owns it now. Reply: 1 removed, 0 left alone.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
