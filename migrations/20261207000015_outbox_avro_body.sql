-- A reservation step's outbox row stores its body as Avro binary in `body` (issue 48; the
-- format is in processors/pipeline/src/step_body.rs): about 150 bytes against 600 of JSON in
-- `payload`, which such a row leaves NULL. Every other row keeps its JSON payload.
--
-- Online: adding a nullable column at the end is INSTANT (metadata only). Making `payload`
-- nullable is not instant on MariaDB 10.11 (it rebuilds the table), but it is INPLACE with
-- LOCK=NONE: Trys and the relay go on reading and writing while the rebuild runs, and only
-- its last moment takes the table's exclusive metadata lock. The outbox holds only unsent
-- rows and those within the relay's purge delay, so the rebuild is short. The clauses make
-- the statements fail instead of copying the table under a lock.
--
-- Rolling upgrade: a binary of the previous version inserts without naming `body` and keeps
-- working. Its relay cannot read a body row: such a row waits in RETRY (reason "payload is
-- not readable") until a relay of this version holds the lease, as docs/operations.md says
-- for this release.
ALTER TABLE inventory_outbox
  ADD COLUMN IF NOT EXISTS body BLOB DEFAULT NULL
    COMMENT 'a reservation step body as Avro (pipeline step_body.rs), payload NULL then',
  ALGORITHM=INSTANT;
ALTER TABLE inventory_outbox MODIFY payload JSON DEFAULT NULL, ALGORITHM=INPLACE, LOCK=NONE;
