-- When a shard is due again because its last pass left a suspicion to look at (a first
-- sighting, or a suspected difference whose Redis version moved) or did not finish. A
-- suspicion is confirmed or cleared by a second look; at the shard's interval (60 s by
-- default) a difference born of lag (the projector behind under a fault) stayed open a minute
-- after the lag was gone, and a real one waited a minute to be reported. Due at recheck_at,
-- reconcile.settle_secs after the pass, like the on-demand check's second pass.
ALTER TABLE inventory_reconcile_shard
  ADD COLUMN recheck_at DATETIME(3) DEFAULT NULL COMMENT 'due again at this time: a suspicion to look at again (UTC)';
