"""Small histories and final states in the checker's real input format, for its unit tests
(test_checker.py, test_replay.py): a history as history.py writes it (records with seq, mono,
wall, kind) and a final MySQL and Redis state behind the interface of state.State (query,
redis.hgetall, redis_keys, tables, redis_dump).

World.good() is one bucket of 10 units where everything agrees: order 1's Try answered
RESERVED and was confirmed by an acknowledged OrderCreated, order 2's Try answered RESERVED
and was canceled by an acknowledged OrderCreatedFailed, one invalid record was sent on purpose
and parked, the reads of the stock never saw a negative number. A test breaks one thing and
expects the checker to name it.
"""

import copy
import datetime as dt
import re

MERCHANT, DISH, DAY = 501, 1, dt.date(2026, 12, 7)
BUCKET = f"bucket_{MERCHANT}_{DISH}_{DAY:%Y%m%d}"
TAG = f"inv:{{{MERCHANT}:{DISH}:{DAY.isoformat()}}}"
TOPIC = "order.lifecycle.v1"

# Stored codes (stocksvr_harness.codes), spelled out here so a wrong table there fails a test.
RESERVED, CONFIRMED, CANCELED, PREPARING, REFUNDED = 20, 40, 60, 10, 90
INIT, TRY, CONFIRM, CANCEL, REFUND = 1, 2, 3, 4, 6


class FakeRedis:
    def __init__(self, keys):
        self.keys = keys  # key -> hash (dict of strings) or (type, value)

    def hgetall(self, key):
        return dict(self.keys.get(key, {}))


class FakeState:
    """What Checker and replay.dump read from state.State, served from dicts."""

    def __init__(self, tables, redis_keys, primary_keys=None):
        self.tables_ = tables  # table -> [row dict]
        self.redis = FakeRedis(redis_keys)
        self.primary_keys = primary_keys or {}

    def query(self, sql, args=None):
        m = re.match(r"SHOW KEYS FROM `(\w+)`", sql)
        if m:
            return [{"Column_name": c} for c in self.primary_keys.get(m.group(1), ["id"])]
        table = re.search(r"FROM `?(\w+)`?", sql).group(1)
        return [dict(r) for r in self.tables_.get(table, [])]

    def tables(self):
        return sorted(self.tables_)

    def redis_keys(self, pattern="*"):
        prefix = pattern.rstrip("*")
        return sorted(k for k in self.redis.keys if k.startswith(prefix))

    def redis_dump(self):
        return {k: (("hash", dict(v)) if isinstance(v, dict) else v) for k, v in self.redis.keys.items()}


class World:
    """One history and one final state; `check()` runs the real checker over them."""

    def __init__(self):
        self.records = []
        self.tables = {"inventory_reservation": [], "inventory_ledger": [], "dish_stock_snapshot": [],
                       "dish_stock_baseline": [], "inventory_operation_wal": [], "inventory_refund": [],
                       "inventory_dead_letter": []}
        self.redis = {}
        self.plan = {BUCKET: {"totals": [10]}}
        self._op = 0

    # ---- the history --------------------------------------------------------------------

    def record(self, kind, **fields):
        seq = len(self.records) + 1
        rec = {"seq": seq, "mono": float(seq), "wall": f"2026-12-07T12:00:{seq % 60:02d}.000000+00:00",
               "kind": kind}
        rec.update(fields)
        self.records.append(rec)
        return rec

    def try_answer(self, reservation_id, order_id, status="RESERVED", http_status=201):
        """A single-item Try request and its answer."""
        self._op += 1
        self.record("request", op=self._op, op_kind="try", client=1, method="POST", path="/v1/reservations",
                    body={"order_id": order_id})
        body = {"reservation": {"reservation_id": reservation_id, "status": status, "order_id": order_id}}
        return self.record("response", op=self._op, op_kind="try", client=1, status=http_status, body=body,
                           seconds=0.01)

    def http_answer(self, op_kind, status, body):
        self._op += 1
        self.record("request", op=self._op, op_kind=op_kind, client=1, method="GET", path="/x", body=None)
        return self.record("response", op=self._op, op_kind=op_kind, client=1, status=status, body=body,
                           seconds=0.01)

    def ack(self, event_id, event_type, order_id, offset, intended_dlt=None, partition=0):
        return self.record("produce_ack", event_id=event_id, topic=TOPIC, partition=partition, offset=offset,
                           event_type=event_type, order_id=order_id, dup=False, intended_dlt=intended_dlt)

    def order(self, order_id, fate, items, events):
        return self.record("order", order_id=order_id, fate=fate, items=items, order_type="INSTANT",
                           events=events)

    # ---- the final state ------------------------------------------------------------------

    def reservation(self, rid, order_id, status, quantity, refunded=0, **extra):
        row = {"id": rid, "order_id": order_id, "stock_bucket_id": BUCKET, "status": status,
               "quantity": quantity, "refunded_quantity": refunded, "dead": 0, "stale_alerted_at": None,
               "last_error": None}
        row.update(extra)
        self.tables["inventory_reservation"].append(row)
        return row

    def ledger(self, op, action, version, rid=None, total=0, available=0, reserved=0, sold=0, quantity=0):
        row = {"id": len(self.tables["inventory_ledger"]) + 1, "operation_id": op, "action": action,
               "stock_bucket_id": BUCKET, "reservation_id": rid, "redis_version": version,
               "total_delta": total, "available_delta": available, "reserved_delta": reserved,
               "sold_delta": sold, "quantity": quantity}
        self.tables["inventory_ledger"].append(row)
        return row

    def op_record(self, op, action, version, numbers, **extra):
        h = {"version": str(version), "code": "SUCCEEDED", "action": action}
        h.update({k: str(v) for k, v in numbers.items()})
        h.update(extra)
        self.redis[f"{TAG}:op:{op}"] = h
        return h

    def fence(self, rid, phase, refunded=0, try_op=None):
        h = {"phase": phase, "refunded": str(refunded)}
        if try_op:
            h["try_op"] = try_op
        self.redis[f"{TAG}:reservation:{rid}"] = h
        return h

    def stock(self, total, available, reserved, sold, deficit=0, version=0):
        numbers = {"total": total, "available": available, "reserved": reserved, "sold": sold,
                   "deficit": deficit, "version": version}
        self.redis[f"{TAG}:stock"] = {k: str(v) for k, v in numbers.items()}
        self.tables["dish_stock_snapshot"] = [{
            "stock_bucket_id": BUCKET, "total_stock": total, "available_stock": available,
            "reserved_stock": reserved, "sold_stock": sold, "deficit_stock": deficit, "redis_version": version}]
        self.tables["dish_stock_baseline"] = [{"stock_bucket_id": BUCKET, "merchant_id": MERCHANT, "dish_id": DISH}]

    def dead_letter(self, offset, partition=0, error_class="invalid", key="4", topic=TOPIC):
        row = {"id": len(self.tables["inventory_dead_letter"]) + 1, "dlt_topic": f"{topic}.dlt", "dlt_partition": 0,
               "dlt_offset": offset, "original_topic": topic, "original_partition": partition,
               "original_offset": offset, "consumer_group": "stocksvr.order-lifecycle", "error_class": error_class,
               "error_message": "not Avro", "record_key": key.encode(), "status": 10}
        self.tables["inventory_dead_letter"].append(row)
        return row

    def refund(self, rid, quantity, op, versions=(6,)):
        """A refund of `quantity` sold units of reservation `rid`, DONE, booked in the ledger
        at each of `versions` (more than one: booked twice)."""
        r = self.find("inventory_reservation", id=rid)
        r["refunded_quantity"] += quantity
        r["status"] = REFUNDED if r["refunded_quantity"] == r["quantity"] else r["status"]
        self.fence(rid, "REFUNDED" if r["status"] == REFUNDED else "CONFIRMED", refunded=r["refunded_quantity"],
                   try_op=f"op_try_{rid}")
        self.tables["inventory_refund"].append({"reservation_id": rid, "refund_key": f"rf-{op}", "operation_id": op,
                                                "status": 20})
        for version in versions:
            self.ledger(op, REFUND, version, rid=rid, available=quantity, sold=-quantity, quantity=quantity)

    def state(self):
        return FakeState(copy.deepcopy(self.tables), copy.deepcopy(self.redis))

    def check(self):
        """The anomalies the real checker finds, as {check: [anomaly, ...]}."""
        from checker import Checker

        found = {}
        for a in Checker(self.records, self.plan, self.state()).run():
            found.setdefault(a["check"], []).append(a)
        return found

    # ---- the one good world ---------------------------------------------------------------

    @classmethod
    def good(cls):
        w = cls()
        # The merchant's bucket: 10 units (version 1).
        w.ledger("op_init", INIT, 1, total=10, available=10)
        w.op_record("op_init", "INIT", 1, {"total": 10, "available": 10, "reserved": 0, "sold": 0})
        # Order 1: Try of 2 (version 2) answered RESERVED, OrderCreated acknowledged, confirmed (3).
        w.try_answer(1001, 1)
        w.ledger("op_try_1001", TRY, 2, rid=1001, available=-2, reserved=2, quantity=2)
        w.op_record("op_try_1001", "TRY", 2, {"total": 10, "available": 8, "reserved": 2, "sold": 0})
        w.ack("e1", "OrderCreated", 1, offset=0)
        w.ledger("op_confirm_1001", CONFIRM, 3, rid=1001, reserved=-2, sold=2, quantity=2)
        w.op_record("op_confirm_1001", "CONFIRM", 3, {"total": 10, "available": 8, "reserved": 0, "sold": 2})
        w.reservation(1001, 1, CONFIRMED, 2)
        w.fence(1001, "CONFIRMED", try_op="op_try_1001")
        w.order(1, "confirmed", [{"status": "RESERVED", "reservation_id": 1001}],
                [{"event_id": "e1", "event_type": "OrderCreated", "due": 1.0, "data": {}}])
        # Order 2: Try of 1 (version 4) answered RESERVED, OrderCreatedFailed acknowledged,
        # canceled (5): the unit is back.
        w.try_answer(1002, 2)
        w.ledger("op_try_1002", TRY, 4, rid=1002, available=-1, reserved=1, quantity=1)
        w.op_record("op_try_1002", "TRY", 4, {"total": 10, "available": 7, "reserved": 1, "sold": 2})
        w.ack("e2", "OrderCreatedFailed", 2, offset=1)
        w.ledger("op_cancel_1002", CANCEL, 5, rid=1002, available=1, reserved=-1, quantity=1)
        w.op_record("op_cancel_1002", "CANCEL", 5, {"total": 10, "available": 8, "reserved": 0, "sold": 2})
        w.reservation(1002, 2, CANCELED, 1)
        w.fence(1002, "CANCELED", try_op="op_try_1002")
        w.order(2, "failed", [{"status": "RESERVED", "reservation_id": 1002}],
                [{"event_id": "e2", "event_type": "OrderCreatedFailed", "due": 1.0, "data": {}}])
        # One record sent invalid on purpose, parked by the dead-letter processor.
        w.ack("bad-1", None, 4, offset=2, intended_dlt="garbage")
        w.dead_letter(offset=2)
        # Reads of the numbers, through the API and straight from Redis: never negative.
        w.http_answer("stock_read", 200, {"redis": {"available": 8, "reserved": 0, "sold": 2, "deficit": 0}})
        w.record("redis_read", bucket=BUCKET, stock={"available": "8", "reserved": "0", "sold": "2"})
        w.stock(total=10, available=8, reserved=0, sold=2, version=5)
        return w

    def find(self, table, **match):
        for row in self.tables[table]:
            if all(row.get(k) == v for k, v in match.items()):
                return row
        raise KeyError(f"no {table} row {match}")
