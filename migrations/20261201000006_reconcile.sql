-- Reconciliation, versioned repair and Redis rebuild (issue 10, seed §13).

-- A bucket whose Redis key is gone although it was built (a flushed or failed-over Redis).
-- Set by whoever notices first (a Try, a step, the reconciler); while set, a Try is refused
-- with 503 bucket_lost before any row is written, and every step of an existing reservation
-- fails closed. Cleared only after a rebuild and a clean reconcile pass.
ALTER TABLE dish_stock_baseline
  ADD COLUMN lost_at DATETIME(3) DEFAULT NULL COMMENT 'Redis lost this bucket; refused until rebuilt and reconciled',
  ADD KEY idx_lost (lost_at);

-- The reconciler's shards: buckets are spread over them by merchant_id and dish_id, and an
-- instance checks a shard only while it holds the shard's lease, so several instances split
-- the work and no bucket is checked twice at once.
CREATE TABLE IF NOT EXISTS inventory_reconcile_shard (
  shard INT UNSIGNED NOT NULL,
  lease_owner VARCHAR(64) DEFAULT NULL,
  lease_expire_at DATETIME(3) NOT NULL,
  last_pass_at DATETIME(3) DEFAULT NULL,
  PRIMARY KEY (shard)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- What the reconciler saw differ. A difference is SUSPECTED on its first pass and CONFIRMED
-- when a second pass finds the same kind at the same Redis version with nothing in flight;
-- only confirmed ones are reported, alerted and repaired. Resolved when a pass finds the
-- bucket consistent. views holds the three views (Redis, reservations, ledger) and the snapshot.
-- status: 10=suspected 20=confirmed 30=resolved
CREATE TABLE IF NOT EXISTS inventory_reconcile_difference (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  stock_bucket_id VARCHAR(64) NOT NULL,
  kind VARCHAR(32) NOT NULL,
  redis_version BIGINT UNSIGNED NOT NULL,
  status TINYINT NOT NULL,
  views JSON NOT NULL,
  repair_operation_id VARCHAR(64) DEFAULT NULL,
  first_seen_at DATETIME(3) NOT NULL,
  confirmed_at DATETIME(3) DEFAULT NULL,
  resolved_at DATETIME(3) DEFAULT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  KEY idx_bucket_status (stock_bucket_id, status),
  KEY idx_status_first (status, first_seen_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Inbox retention: rows older than retention.inbox_days are purged in batches.
ALTER TABLE inventory_consumer_inbox ADD KEY idx_consumed (consumed_at);
