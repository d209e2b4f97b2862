-- Secondary indexes no statement reads (issue 48): each cost an entry at every write of its
-- row and bytes on disk, and bought nothing.
--
-- inventory_operation_wal.idx_lease (status, lease_expire_at): every lease statement finds its
-- row by operation_id (uk_operation_id); lease_expire_at is only a filter on that one row.
-- inventory_operation_wal.uk_bucket_action (stock_bucket_id, operation_id): its uniqueness is
-- implied by uk_operation_id; the reads by bucket (in-flight work, restore, the WAL views) need
-- only the bucket, so a plain key on it serves them.
-- inventory_dead_letter.idx_origin (original_topic, original_partition, original_offset): the
-- park deduplicates on uk_origin_record, and the list filters the topic on a primary key range.
--
-- Online: dropping a secondary index is a metadata change, and adding one is built in place
-- while reads and writes go on (LOCK=NONE); both tables hold a few rows per bucket and day.
ALTER TABLE inventory_operation_wal
  ADD KEY IF NOT EXISTS idx_bucket (stock_bucket_id),
  ALGORITHM=INPLACE, LOCK=NONE;
ALTER TABLE inventory_operation_wal
  DROP INDEX IF EXISTS uk_bucket_action,
  DROP INDEX IF EXISTS idx_lease;
ALTER TABLE inventory_dead_letter DROP INDEX IF EXISTS idx_origin;
