-- Tables the processors need beyond seed section 4.

-- Merchant time zone: a Try must know the business day before it can name the bucket.
CREATE TABLE IF NOT EXISTS merchant_settings (
  merchant_id BIGINT UNSIGNED NOT NULL,
  timezone VARCHAR(64) NOT NULL COMMENT 'IANA time zone, e.g. Asia/Shanghai',
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (merchant_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Parked dead letters: the dead-letter processor stores each record with its origin so
-- an operator can list, replay or discard it. Unique on the dead-letter coordinates so
-- a redelivered dead letter is parked once.
-- status: 10=parked 20=replayed 30=discarded
CREATE TABLE IF NOT EXISTS inventory_dead_letter (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  dlt_topic VARCHAR(249) NOT NULL,
  dlt_partition INT NOT NULL,
  dlt_offset BIGINT NOT NULL,
  original_topic VARCHAR(249) NOT NULL,
  original_partition INT NOT NULL,
  original_offset BIGINT NOT NULL,
  original_timestamp_ms BIGINT DEFAULT NULL,
  consumer_group VARCHAR(255) NOT NULL,
  error_class VARCHAR(32) NOT NULL COMMENT 'invalid | retryable-exhausted',
  error_message VARCHAR(2048) NOT NULL,
  record_key VARBINARY(1024) DEFAULT NULL,
  record_value MEDIUMBLOB DEFAULT NULL,
  status TINYINT NOT NULL DEFAULT 10,
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_dlt_position (dlt_topic, dlt_partition, dlt_offset),
  KEY idx_status_created (status, created_at),
  KEY idx_origin (original_topic, original_partition, original_offset)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Snowflake worker-id leases: two running instances must never share a worker id.
-- An instance holds its row by renewing lease_expire_at; an expired row may be taken.
CREATE TABLE IF NOT EXISTS snowflake_worker_lease (
  worker_id INT UNSIGNED NOT NULL,
  lease_owner VARCHAR(128) NOT NULL,
  lease_expire_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (worker_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
