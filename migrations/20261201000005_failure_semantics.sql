-- Failure semantics of the pipeline (issue 9).

-- The order fence: an OrderCreatedFailed records the failure of its order here, in the same
-- transaction as the cancel decision (the CAS of every cancellable reservation to CANCELING).
-- A Try inserts its PREPARING row only if no fence exists, in one INSERT ... SELECT: under
-- REPEATABLE READ the NOT EXISTS probe takes a lock on the fence key, so the two serialize
-- and no Try can slip in after the cancel decision (the TCC "hanging" problem, solved at the
-- order level where the per-reservation fence cannot reach: the failure may come before any
-- reservation exists). A fenced Try becomes a REJECTED row with reason ORDER_FAILED.
CREATE TABLE IF NOT EXISTS inventory_order_fence (
  order_id BIGINT UNSIGNED NOT NULL,
  event_id VARCHAR(128) NOT NULL COMMENT 'the OrderCreatedFailed that wrote it',
  reason VARCHAR(255) DEFAULT NULL,
  created_at DATETIME(3) NOT NULL,
  PRIMARY KEY (order_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- Order events that cannot apply yet (a RefundRequested before its OrderCreated): parked by
-- order, with the record's bytes, and re-driven when the order's next event applies or by
-- the deferred-event worker with backoff. The partition moves on meanwhile.
-- status: 10=waiting 20=applied 30=reported (a conflict report was emitted instead)
CREATE TABLE IF NOT EXISTS inventory_deferred_event (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  consumer_group VARCHAR(255) NOT NULL,
  order_id BIGINT UNSIGNED NOT NULL,
  event_id VARCHAR(128) NOT NULL,
  event_name VARCHAR(255) NOT NULL,
  topic VARCHAR(249) NOT NULL,
  kafka_partition INT NOT NULL,
  kafka_offset BIGINT NOT NULL,
  event_json JSON NOT NULL COMMENT 'the decoded event the re-drive applies',
  waiting_for VARCHAR(1024) NOT NULL COMMENT 'why it cannot apply yet',
  status TINYINT NOT NULL DEFAULT 10,
  attempts INT UNSIGNED NOT NULL DEFAULT 0,
  next_attempt_at DATETIME(3) NOT NULL,
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_origin (consumer_group, topic, kafka_partition, kafka_offset),
  KEY idx_order (order_id, status, id),
  KEY idx_due (status, next_attempt_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- One parked dead letter per origin record, however many copies a replay of the source
-- topic writes to the dead-letter topic.
ALTER TABLE inventory_dead_letter
  ADD UNIQUE KEY uk_origin_record (consumer_group, original_topic, original_partition, original_offset);
