-- What the reservation service needs to resume an interrupted step exactly.

-- A Refund in flight must be resumable with its own quantity, and a partial refund returns
-- the reservation to the status it came from (CONFIRMED or CREATED_RESERVED).
ALTER TABLE inventory_reservation
  ADD COLUMN pending_quantity INT UNSIGNED NOT NULL DEFAULT 0 COMMENT 'quantity of the Redis step in flight (refunds may be partial)',
  ADD COLUMN resume_status TINYINT DEFAULT NULL COMMENT 'status a partial refund returns to',
  ADD COLUMN reject_reason VARCHAR(64) DEFAULT NULL COMMENT 'why a Try was REJECTED (INSUFFICIENT_STOCK, BUCKET_CLOSED)';

-- One row per refund request (order service refund_id, or "full" for OrderCanceled): the
-- same request replayed returns its first result and never refunds twice.
-- status: 10=in progress, 20=done, 30=rejected
CREATE TABLE IF NOT EXISTS inventory_refund (
  reservation_id BIGINT UNSIGNED NOT NULL,
  refund_key VARCHAR(64) NOT NULL,
  operation_id VARCHAR(64) NOT NULL,
  quantity INT UNSIGNED NOT NULL,
  status TINYINT NOT NULL,
  redis_version BIGINT UNSIGNED DEFAULT NULL,
  created_at DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (reservation_id, refund_key),
  UNIQUE KEY uk_operation_id (operation_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
