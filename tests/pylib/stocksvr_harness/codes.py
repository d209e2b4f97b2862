"""The integers stocksvr stores that the harnesses read back (migrations/*.sql): one place for
the checkers and the bench, so a renumbering breaks one file. Names as the design spells them.
"""

# inventory_reservation.status
PREPARING, RESERVED, CREATED_RESERVED, CONFIRMING, CONFIRMED = 10, 20, 25, 30, 40
CANCELING, CANCELED, REJECTED, REFUNDING, REFUNDED = 50, 60, 70, 80, 90
RESERVATION_STATUS = {PREPARING: "PREPARING", RESERVED: "RESERVED", CREATED_RESERVED: "CREATED_RESERVED",
                      CONFIRMING: "CONFIRMING", CONFIRMED: "CONFIRMED", CANCELING: "CANCELING",
                      CANCELED: "CANCELED", REJECTED: "REJECTED", REFUNDING: "REFUNDING", REFUNDED: "REFUNDED"}
# A worker still owes the next step of a reservation in one of these.
INTERMEDIATE = (PREPARING, CONFIRMING, CANCELING, REFUNDING)
# Reservations whose units are held (reserved, not sold).
HOLDING = (RESERVED, CREATED_RESERVED)

# inventory_ledger.action
LEDGER_ACTION = {1: "INIT", 2: "TRY", 3: "CONFIRM", 4: "CANCEL", 5: "ADJUST", 6: "REFUND", 7: "REPAIR",
                 8: "REBUILD"}
LEDGER_TRY, LEDGER_REFUND = 2, 6

# inventory_operation_wal.action and .status
WAL_ACTION = {1: "INIT_BUCKET", 2: "ADJUST", 3: "REPAIR", 4: "CLOSE", 5: "ARCHIVE", 6: "REBUILD"}
WAL_STATUS = {10: "INIT", 20: "EXECUTING", 30: "SUCCEEDED", 40: "RETRY", 50: "DEAD"}
WAL_SUCCEEDED = 30
WAL_UNFINISHED = (10, 20, 40)

# inventory_refund.status
REFUND_DONE = 20

# inventory_outbox rows not sent yet (processors/outbox-relay/src/store.rs, UNSENT): the relay's
# scan leaves a published row PENDING (10) and moves the high-water mark over it; the retry path
# marks SENT (30). Use as `FROM inventory_outbox o JOIN inventory_outbox_relay c ON c.id = 1
# WHERE ...`.
OUTBOX_UNSENT = "((o.id > c.hwm AND o.status = 10) OR o.status IN (20, 40))"
OUTBOX_SENT = "((o.id <= c.hwm AND o.status = 10) OR o.status = 30)"
OUTBOX_UNSENT_FROM = f"FROM inventory_outbox o JOIN inventory_outbox_relay c ON c.id = 1 WHERE {OUTBOX_UNSENT}"

# inventory_deferred_event.status and inventory_reconcile_difference.status still to act on
DEFERRED_PARKED = 10
DIFFERENCE_SUSPECTED = 10


def sql_list(codes):
    """`(10,30,50)` for an SQL IN list of stored codes (integers only, never user input)."""
    return "(" + ",".join(str(int(c)) for c in codes) + ")"
