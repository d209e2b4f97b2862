-- The ledger loses what no statement reads (issue 48): every projected event wrote them.
--
-- inventory_ledger.ledger_id with uk_ledger_id: the projector set it to the operation id
-- (there was never another value), so it was a second copy of operation_id with a second
-- unique index over it. The index goes now, the column once no older binary writes it. uk_operation_id stays: it books an operation once and is now also
-- how the projector recognises a redelivered event (it writes no inbox row any more).
--
-- inventory_ledger.idx_dish_created (merchant_id, dish_id, created_at): no statement reads
-- the ledger by merchant or dish; the reconciler's sums and the restore read it by bucket
-- (idx_bucket_created).
--
-- Safe on a populated table. Each statement names its algorithm, so the server refuses it
-- rather than copy the table under a lock:
-- - DROP INDEX, ALGORITHM=NOCOPY, LOCK=NONE: a change of the table's metadata; reads and
--   writes go on while it runs. Only its start and end take the table's exclusive
--   metadata lock for a moment, which waits for running transactions on the table (a long
--   reconciler read) and makes new statements queue behind it meanwhile.
-- - ALTER COLUMN ... SET DEFAULT '', ALGORITHM=INSTANT: metadata only, the same brief
--   exclusive metadata lock, no row is rewritten. This release writes no ledger_id; the column
--   stays (empty in new rows) so a projector of the previous release, which still names it in
--   its INSERT, keeps booking during a rolling upgrade. A later release drops it: a column
--   an older binary still writes goes in two releases (docs/operations.md, "Upgrading").
ALTER TABLE inventory_ledger DROP INDEX IF EXISTS uk_ledger_id, ALGORITHM=NOCOPY, LOCK=NONE;
ALTER TABLE inventory_ledger DROP INDEX IF EXISTS idx_dish_created, ALGORITHM=NOCOPY, LOCK=NONE;
ALTER TABLE inventory_ledger ALTER COLUMN ledger_id SET DEFAULT '', ALGORITHM=INSTANT;
