-- stocksvr core schema (seed 000 section 4). Runs on MariaDB 10.11 and MySQL 8.0:
-- no DEFAULT (expr), no CHECK constraints beyond what both accept, JSON columns as the
-- JSON type (an alias of LONGTEXT with json_valid on MariaDB).

-- 4.1 The merchant's stock baseline per business day. Not touched on the Try path
-- (a hot dish would make it a hot row); used for audit, reconcile and Redis rebuild.
CREATE TABLE IF NOT EXISTS dish_stock_baseline (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  stock_bucket_id VARCHAR(64) NOT NULL COMMENT 'bucket id shared by MySQL, Redis and Kafka',
  merchant_id BIGINT UNSIGNED NOT NULL,
  dish_id BIGINT UNSIGNED NOT NULL,
  stock_date DATE NOT NULL COMMENT 'business day in the merchant time zone',
  timezone VARCHAR(64) NOT NULL COMMENT 'IANA zone the business day was computed in',
  total_stock BIGINT NOT NULL,
  baseline_version BIGINT UNSIGNED NOT NULL DEFAULT 1 COMMENT 'bumped on every adjustment; init_bucket is idempotent per version',
  stock_status TINYINT NOT NULL DEFAULT 1 COMMENT '1=enabled, 2=disabled',
  bucket_status TINYINT NOT NULL DEFAULT 10 COMMENT 'bucket lifecycle: 10=open, 20=closed (no new Try), 30=archived',
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_stock_bucket_id (stock_bucket_id),
  UNIQUE KEY uk_merchant_dish_date (merchant_id, dish_id, stock_date),
  KEY idx_date_status (stock_date, bucket_status)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- 4.2 Projection of the Redis numbers, written only by the projector and only with a
-- newer redis_version, so a stale event can never overwrite a newer state.
CREATE TABLE IF NOT EXISTS dish_stock_snapshot (
  stock_bucket_id VARCHAR(64) NOT NULL,
  merchant_id BIGINT UNSIGNED NOT NULL,
  dish_id BIGINT UNSIGNED NOT NULL,
  stock_date DATE NOT NULL,
  total_stock BIGINT NOT NULL,
  available_stock BIGINT NOT NULL,
  reserved_stock BIGINT NOT NULL,
  sold_stock BIGINT NOT NULL,
  deficit_stock BIGINT NOT NULL DEFAULT 0 COMMENT 'reserved+sold above total after an adjustment below what was already accepted',
  redis_version BIGINT UNSIGNED NOT NULL COMMENT 'Redis version this row reflects',
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (stock_bucket_id),
  KEY idx_dish_date (merchant_id, dish_id, stock_date)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- 4.3 One row per order item and dish: where its stock transaction stands.
-- status: 10=preparing 20=reserved 25=created_reserved 30=confirming 40=confirmed
--         50=canceling 60=canceled 70=rejected 80=refunding 90=refunded
-- Every status change is a CAS on (status, version).
CREATE TABLE IF NOT EXISTS inventory_reservation (
  id BIGINT UNSIGNED NOT NULL COMMENT 'snowflake id generated before the row exists',
  order_id BIGINT UNSIGNED NOT NULL,
  order_item_id BIGINT UNSIGNED NOT NULL,
  merchant_id BIGINT UNSIGNED NOT NULL,
  dish_id BIGINT UNSIGNED NOT NULL,
  stock_bucket_id VARCHAR(64) NOT NULL COMMENT 'fixed at Try; Confirm/Cancel/Refund never recompute it',
  stock_date DATE NOT NULL,
  quantity INT UNSIGNED NOT NULL,
  refunded_quantity INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'sum of partial refunds; never exceeds quantity',
  order_type TINYINT NOT NULL COMMENT '1=instant, 2=scheduled',
  processing_time DATETIME(3) DEFAULT NULL COMMENT 'scheduled orders confirm at this time',
  expire_at DATETIME(3) NOT NULL COMMENT 'past this a RESERVED row is alerted, never cancelled',
  status TINYINT NOT NULL,
  current_operation_id VARCHAR(64) NOT NULL COMMENT 'idempotency id of the Redis step in flight',
  retry_count INT UNSIGNED NOT NULL DEFAULT 0,
  next_retry_at DATETIME(3) NOT NULL,
  last_error VARCHAR(1024) DEFAULT NULL,
  dead TINYINT NOT NULL DEFAULT 0 COMMENT '1 once recovery gave up; stays visible for an operator',
  sync_status TINYINT NOT NULL DEFAULT 10 COMMENT '10=pending, 20=synced, 30=retry, 40=dead',
  expected_redis_version BIGINT UNSIGNED DEFAULT NULL,
  synced_redis_version BIGINT UNSIGNED NOT NULL DEFAULT 0,
  version INT UNSIGNED NOT NULL DEFAULT 1,
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_order_item_dish (order_item_id, dish_id),
  KEY idx_stock_bucket (stock_bucket_id),
  KEY idx_sync_status (sync_status, updated_at),
  KEY idx_expire_scan (status, expire_at),
  KEY idx_state_retry (status, next_retry_at),
  KEY idx_schedule_scan (status, processing_time),
  KEY idx_order_id (order_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- 4.4 Append-only ledger; operation_id unique so one Redis operation is booked once.
-- action: 1=init 2=try 3=confirm 4=cancel 5=adjust 6=refund 7=repair
CREATE TABLE IF NOT EXISTS inventory_ledger (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  ledger_id VARCHAR(64) NOT NULL,
  operation_id VARCHAR(64) NOT NULL,
  reservation_id BIGINT UNSIGNED DEFAULT NULL,
  stock_bucket_id VARCHAR(64) NOT NULL,
  order_id BIGINT UNSIGNED DEFAULT NULL,
  order_item_id BIGINT UNSIGNED DEFAULT NULL,
  merchant_id BIGINT UNSIGNED NOT NULL,
  dish_id BIGINT UNSIGNED NOT NULL,
  action TINYINT NOT NULL,
  quantity INT UNSIGNED NOT NULL,
  available_delta BIGINT NOT NULL DEFAULT 0,
  reserved_delta BIGINT NOT NULL DEFAULT 0,
  sold_delta BIGINT NOT NULL DEFAULT 0,
  total_delta BIGINT NOT NULL DEFAULT 0 COMMENT 'init and adjust change the total',
  redis_version BIGINT UNSIGNED DEFAULT NULL,
  created_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_ledger_id (ledger_id),
  UNIQUE KEY uk_operation_id (operation_id),
  KEY idx_bucket_created (stock_bucket_id, created_at),
  KEY idx_dish_created (merchant_id, dish_id, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- 4.5 WAL for operations without a reservation (init_bucket, adjust, repair): committed
-- before Redis is touched, so a crash leaves a row a worker can resume.
-- action: 1=init_bucket 2=adjust 3=repair; status: 10=init 20=executing 30=succeeded 40=retry 50=dead
CREATE TABLE IF NOT EXISTS inventory_operation_wal (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  operation_id VARCHAR(64) NOT NULL,
  stock_bucket_id VARCHAR(64) NOT NULL,
  action TINYINT NOT NULL,
  status TINYINT NOT NULL,
  request_payload JSON NOT NULL,
  result_payload JSON DEFAULT NULL,
  retry_count INT UNSIGNED NOT NULL DEFAULT 0,
  next_retry_at DATETIME(3) NOT NULL,
  lease_owner VARCHAR(64) DEFAULT NULL,
  lease_expire_at DATETIME(3) DEFAULT NULL,
  last_error VARCHAR(1024) DEFAULT NULL,
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_operation_id (operation_id),
  UNIQUE KEY uk_bucket_action (stock_bucket_id, operation_id),
  KEY idx_retry (status, next_retry_at),
  KEY idx_lease (status, lease_expire_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- 4.6 Transactional outbox: written in the same transaction as the state change it
-- announces; the relay publishes and marks SENT only after the broker acknowledged.
-- status: 10=pending 20=sending 30=sent 40=retry
CREATE TABLE IF NOT EXISTS inventory_outbox (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  event_id VARCHAR(64) NOT NULL,
  aggregate_id BIGINT UNSIGNED NOT NULL COMMENT 'reservation id, or the WAL id for non-order operations',
  event_type VARCHAR(64) NOT NULL,
  topic VARCHAR(249) NOT NULL COMMENT 'Kafka topic the relay publishes to',
  partition_key VARCHAR(64) NOT NULL,
  schema_version INT UNSIGNED NOT NULL DEFAULT 1,
  payload JSON NOT NULL,
  status TINYINT NOT NULL DEFAULT 10,
  retry_count INT UNSIGNED NOT NULL DEFAULT 0,
  next_retry_at DATETIME(3) NOT NULL,
  last_error VARCHAR(1024) DEFAULT NULL,
  created_at DATETIME(3) NOT NULL,
  sent_at DATETIME(3) DEFAULT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_event_id (event_id),
  KEY idx_publish (status, next_retry_at),
  KEY idx_purge (status, sent_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Consumer inbox: INSERT IGNORE of (event_id, group) in the effect's own transaction
-- makes a redelivered event a no-op.
CREATE TABLE IF NOT EXISTS inventory_consumer_inbox (
  event_id VARCHAR(64) NOT NULL,
  consumer_group VARCHAR(64) NOT NULL,
  consumed_at DATETIME(3) NOT NULL,
  PRIMARY KEY (event_id, consumer_group)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
