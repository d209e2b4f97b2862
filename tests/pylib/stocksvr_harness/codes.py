"""The integers stocksvr stores that the harnesses read back. They are not copied here: they
come from processors/core/stored-codes.json, which a test of the core crate keeps equal to the
one table of stored codes (processors/core/src/codes.rs), so a renumbering there reaches the
checkers and the bench without an edit.
"""

import json
from pathlib import Path

_TABLE = json.loads((Path(__file__).resolve().parents[3] / "processors/core/stored-codes.json").read_text())


def column(name):
    """{code: name} of one stored column, e.g. column("inventory_reservation.status")."""
    return {code: label for label, code in _TABLE[name].items()}


def code(column_name, label):
    """The code stored for `label` in `column_name`; KeyError names both when it is unknown."""
    try:
        return _TABLE[column_name][label]
    except KeyError:
        raise KeyError(f"{label} in {column_name}") from None


# inventory_reservation.status
RESERVATION_STATUS = column("inventory_reservation.status")
_R = {label: c for c, label in RESERVATION_STATUS.items()}
PREPARING, RESERVED, CREATED_RESERVED, CONFIRMING, CONFIRMED = (
    _R[n] for n in ("PREPARING", "RESERVED", "CREATED_RESERVED", "CONFIRMING", "CONFIRMED"))
CANCELING, CANCELED, REJECTED, REFUNDING, REFUNDED = (
    _R[n] for n in ("CANCELING", "CANCELED", "REJECTED", "REFUNDING", "REFUNDED"))
# A worker still owes the next step of a reservation in one of these.
INTERMEDIATE = (PREPARING, CONFIRMING, CANCELING, REFUNDING)
# Reservations whose units are held (reserved, not sold).
HOLDING = (RESERVED, CREATED_RESERVED)

# inventory_ledger.action
LEDGER_ACTION = column("inventory_ledger.action")
LEDGER_TRY, LEDGER_REFUND = code("inventory_ledger.action", "TRY"), code("inventory_ledger.action", "REFUND")

# inventory_operation_wal.action and .status
WAL_ACTION = column("inventory_operation_wal.action")
WAL_STATUS = column("inventory_operation_wal.status")
WAL_SUCCEEDED = code("inventory_operation_wal.status", "SUCCEEDED")
WAL_UNFINISHED = tuple(code("inventory_operation_wal.status", n) for n in ("INIT", "EXECUTING", "RETRY"))

# inventory_refund.status
REFUND_DONE = code("inventory_refund.status", "DONE")

# inventory_outbox rows not sent yet (processors/outbox-relay/src/store.rs, UNSENT): the relay's
# scan leaves a published row PENDING (10) and moves the high-water mark over it; the retry path
# marks SENT (30). Use as `FROM inventory_outbox o JOIN inventory_outbox_relay c ON c.id = 1
# WHERE ...`.
_PENDING, _SENDING, _SENT, _RETRY = (
    code("inventory_outbox.status", n) for n in ("PENDING", "SENDING", "SENT", "RETRY"))
OUTBOX_UNSENT = f"((o.id > c.hwm AND o.status = {_PENDING}) OR o.status IN ({_SENDING}, {_RETRY}))"
OUTBOX_SENT = f"((o.id <= c.hwm AND o.status = {_PENDING}) OR o.status = {_SENT})"
OUTBOX_UNSENT_FROM = f"FROM inventory_outbox o JOIN inventory_outbox_relay c ON c.id = 1 WHERE {OUTBOX_UNSENT}"

# inventory_deferred_event.status and inventory_reconcile_difference.status still to act on
DEFERRED_PARKED = code("inventory_deferred_event.status", "WAITING")
DIFFERENCE_SUSPECTED = code("inventory_reconcile_difference.status", "SUSPECTED")


def sql_list(codes):
    """`(10,30,50)` for an SQL IN list of stored codes (integers only, never user input)."""
    return "(" + ",".join(str(int(c)) for c in codes) + ")"
