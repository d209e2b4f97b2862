-- The order's milestones a reservation passed (issue 48): bit 1 = OrderCreated applied
-- (CREATED_RESERVED or CONFIRMED reached), bit 2 = CONFIRMED reached. Set by the completing
-- CAS that lands there, in the row it already writes, so order-lifecycle recognises a
-- replayed OrderCreated without writing a consumer inbox row per event.
--
-- Rows written before this column read 0: a replay of their events is still recognised by the
-- inbox rows the earlier version wrote: order-lifecycle keeps reading them, and the purge keeps
-- them for reconcile.inbox_retention_days (7), the order topic's default retention (7 days).
--
-- Online: an instant ADD COLUMN (MariaDB 10.3+), a metadata change with no table copy.
ALTER TABLE inventory_reservation
  ADD COLUMN IF NOT EXISTS reached TINYINT UNSIGNED NOT NULL DEFAULT 0
    COMMENT 'order milestones passed: 1=created, 2=confirmed',
  ALGORITHM=INSTANT;
