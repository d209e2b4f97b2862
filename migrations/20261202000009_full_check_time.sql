-- When the reconciler last found a bucket consistent with the fences and op records of all
-- its held reservations read (a full check, reconcile.full_check_secs). Kept in memory only,
-- every start of an instance read every held reservation of every bucket again at once: a
-- restart during the day's peak put a full check of hundreds of thousands of reservations
-- beside the load it came back to serve (issue 12). A bucket checked in full less than
-- full_check_secs ago is now only compared by its numbers after a restart, as before it.
-- Written by the reconciler only, never by a Try or an adjustment; updated_at is untouched.
ALTER TABLE dish_stock_baseline
  ADD COLUMN full_checked_at DATETIME(3) DEFAULT NULL COMMENT 'last clean full reconcile check (UTC)';
