-- The stale-reservation watcher alerts each RESERVED row past expire_at once; this marks it.
ALTER TABLE inventory_reservation
  ADD COLUMN stale_alerted_at DATETIME(3) DEFAULT NULL COMMENT 'when the stale-reservation alert went out (it never cancels)';
