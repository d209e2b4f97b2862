-- Two secondary indexes no statement reads any more (issue 12): every row write moved them.
--
-- inventory_reservation.idx_sync_status (sync_status, updated_at): nothing selects by sync
-- status; the PREPARING -> RESERVED update and the projector's sync update each moved the
-- row's entry (updated_at and sync_status change), on the table every Try writes twice.
-- The columns stay: the projector still records what it synced, and an operator's ad hoc
-- query by them scans (the stocksvr_projection_* metrics answer "is the projection behind").
--
-- inventory_outbox.idx_purge (status, sent_at): the purge deletes by primary key below the
-- relay's high-water mark and by created_at (migration 20261202000007), so the index only
-- cost an entry per outbox row (two per Try) and its removal at purge.
ALTER TABLE inventory_reservation DROP INDEX IF EXISTS idx_sync_status;
ALTER TABLE inventory_outbox DROP INDEX IF EXISTS idx_purge;
