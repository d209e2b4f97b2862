-- Outbox relay high-water mark and leader lease (issue 12).
--
-- One row. Only the relay holding the lease (owner, until lease_until, database clock)
-- publishes new outbox rows: it reads them by primary key above its scan cursor and, once
-- the broker acknowledged a prefix, moves hwm with one UPDATE instead of writing every row.
-- Every write of the holder is a compare-and-set on (owner, epoch); taking the lease over
-- bumps epoch, so a stalled ex-holder can neither move hwm back nor forward.
--
-- hwm: every outbox id <= hwm is published, RETRY (owned by the per-row retry path) or
-- never existed (a rolled-back insert, an INSERT IGNORE that found its event_id). A row is
-- therefore sent when id <= hwm and status = 10 (published by the scan), or status = 30
-- (published by the retry path).
CREATE TABLE IF NOT EXISTS inventory_outbox_relay (
  id TINYINT UNSIGNED NOT NULL COMMENT 'always 1',
  hwm BIGINT UNSIGNED NOT NULL,
  owner VARCHAR(128) DEFAULT NULL,
  epoch BIGINT UNSIGNED NOT NULL DEFAULT 0,
  lease_until DATETIME(3) NOT NULL,
  updated_at DATETIME(3) NOT NULL,
  PRIMARY KEY (id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;

-- The starting mark on a database that already holds rows: below the lowest row not SENT,
-- and at most 100,000 ids below the highest, so a row committed late by a transaction open
-- during the migration (its id below rows already visible) is still scanned. The scan skips
-- rows that are already SENT, so starting low costs a scan, not duplicates.
INSERT IGNORE INTO inventory_outbox_relay (id, hwm, owner, epoch, lease_until, updated_at)
SELECT 1,
       LEAST(
         COALESCE((SELECT CAST(MIN(id) AS SIGNED) - 1 FROM inventory_outbox WHERE status IN (10, 20, 40)),
                  9223372036854775807),
         GREATEST(COALESCE((SELECT CAST(MAX(id) AS SIGNED) FROM inventory_outbox), 0) - 100000, 0)
       ),
       NULL, 0, '1970-01-01 00:00:01', NOW(3);
