"""The checker: the history plus the final MySQL and Redis state -> anomalies.

Each anomaly is {check, ids, detail}: `check` names the property, `ids` the reservations,
orders, buckets, events or dead letters involved, `detail` what was seen against what was
expected. Checks (docs/design.md: fence and op records, stock operations, reconcile):

  oversell.read         an observed read of the Redis numbers with available/reserved/sold < 0
  oversell.redis        final Redis numbers negative, or available+reserved+sold != total+deficit
  oversell.ledger_path  replaying a bucket's ledger in redis_version order, a number went below 0
  oversell.total        sold+reserved above every total the merchant ever asked for
  durability            a Try answered 2xx RESERVED whose row is missing, not RESERVED-or-later,
                        or has no TRY ledger row; a Try answered REJECTED whose row is not REJECTED
  applied_once          duplicate ledger operation ids; a reservation with more than one TRY,
                        CONFIRM or CANCEL row; ledger deltas of a reservation that do not add up
                        to what its final status holds; a refund row booked other than once
  redis_ops             a ledger row whose Redis op record is missing or has another version;
                        a Redis op record that moved stock without a ledger row (a ledger gap)
  fence                 the Redis fence of a reservation disagrees with its MySQL status
  not_terminal          a reservation neither terminal nor alerted (stale) nor marked dead
  hanging               a reservation still holding stock although its order failed
                        (OrderCreatedFailed acknowledged by Kafka), e.g. a Try that arrived after
                        the OrderCreatedFailed (workload fate late_try): issue 9.1
  order_outcome         a reservation whose final status / refunded quantity differs from what
                        the acknowledged order events imply
  stores_agree          per bucket: Redis vs ledger-derived vs snapshot vs reservation-derived
                        numbers (seed 13 formula), and the snapshot's version vs the ledger's
  ledger_versions       Redis versions of a bucket without a ledger row that no close/archive
                        explains
  dead_letter.unintended  a parked dead letter the workload did not send on purpose
  dead_letter.missing   an intended invalid record that was not parked
  http_5xx              an API answer 5xx other than 503 (the contract says 503 for outages)
  api_error             an item error inside a 200 order answer other than unavailable, bucket not
                        found/unavailable/lost, invalid, or order_failed after the order's
                        OrderCreatedFailed was acknowledged (e.g. reservation_not_found for a
                        reservation that exists), with what became of the reservation
  quiescence            the system did not settle before the deadline (what was pending)
  replay                (replay.py) a table row or Redis key changed by a replay from earliest
"""

import collections
import re

from state import HOLDING, LEDGER_ACTION, STATUS, TERMINAL, WAL_ACTION
from stocksvr_harness import codes

TAG_RE = re.compile(r"^inv:\{(\d+):(\d+):(\d{4})-(\d{2})-(\d{2})\}:(stock|reservation|op)(?::(.+))?$")


def bucket_of_tag(m):
    return f"bucket_{m.group(1)}_{m.group(2)}_{m.group(3)}{m.group(4)}{m.group(5)}"


def num(v):
    return None if v is None else int(v)


class Checker:
    def __init__(self, records, plan, state, limit_per_check=200):
        self.records = records
        self.plan = plan
        self.state = state
        self.anomalies = []
        self.limit = limit_per_check
        self.per_check = collections.Counter()
        self.stats = collections.OrderedDict()

    def add(self, check, ids, detail):
        self.per_check[check] += 1
        if self.per_check[check] <= self.limit:
            self.anomalies.append({"check": check, "ids": ids, "detail": detail})

    # ---- loading ------------------------------------------------------------------------

    def load(self):
        q = self.state.query
        self.res = {int(r["id"]): r for r in q("SELECT * FROM inventory_reservation")}
        self.ledger = q("SELECT * FROM inventory_ledger ORDER BY id")
        self.snap = {r["stock_bucket_id"]: r for r in q("SELECT * FROM dish_stock_snapshot")}
        self.baseline = {r["stock_bucket_id"]: r for r in q("SELECT * FROM dish_stock_baseline")}
        self.wal = q("SELECT * FROM inventory_operation_wal ORDER BY id")
        self.refunds = q("SELECT * FROM inventory_refund")
        self.dead = q("SELECT id, dlt_topic, dlt_partition, dlt_offset, original_topic, original_partition, "
                      "original_offset, consumer_group, error_class, error_message, record_key, status "
                      "FROM inventory_dead_letter ORDER BY id")
        self.stock, self.fence, self.ops = {}, {}, {}
        r = self.state.redis
        for key in self.state.redis_keys("inv:{*"):
            m = TAG_RE.match(key)
            if not m:
                continue
            kind, rest = m.group(6), m.group(7)
            if kind == "stock":
                self.stock[bucket_of_tag(m)] = r.hgetall(key)
            elif kind == "reservation" and rest:
                self.fence[int(rest)] = r.hgetall(key)
            elif kind == "op" and rest:
                h = r.hgetall(key)
                h["bucket"] = bucket_of_tag(m)
                self.ops[rest] = h
        self.by_order = collections.defaultdict(list)
        for rid, row in self.res.items():
            self.by_order[int(row["order_id"])].append(rid)
        self.ledger_by_res = collections.defaultdict(list)
        self.ledger_by_op = collections.defaultdict(list)
        self.ledger_by_bucket = collections.defaultdict(list)
        for row in self.ledger:
            if row["reservation_id"] is not None:
                self.ledger_by_res[int(row["reservation_id"])].append(row)
            self.ledger_by_op[row["operation_id"]].append(row)
            self.ledger_by_bucket[row["stock_bucket_id"]].append(row)
        self.index_history()
        self.stats["reservations"] = len(self.res)
        self.stats["ledger rows"] = len(self.ledger)
        self.stats["buckets (baseline)"] = len(self.baseline)
        self.stats["redis stock keys"] = len(self.stock)
        self.stats["redis op records"] = len(self.ops)
        self.stats["parked dead letters"] = len(self.dead)

    def index_history(self):
        self.requests = {}
        self.responses = []
        self.acked = {}  # event_id -> first produce_ack
        self.acks_by_pos = {}  # (topic, partition, offset) -> produce_ack
        self.orders = {}
        for rec in self.records:
            k = rec["kind"]
            if k == "request":
                self.requests[rec["op"]] = rec
            elif k == "response":
                self.responses.append(rec)
            elif k == "produce_ack":
                self.acked.setdefault(rec["event_id"], rec)
                self.acks_by_pos[(rec["topic"], rec["partition"], rec["offset"])] = rec
            elif k == "order":
                self.orders[rec["order_id"]] = rec

    # ---- checks -------------------------------------------------------------------------

    def run(self):
        self.load()
        self.check_reads()
        self.check_buckets()
        self.check_tries()
        self.check_reservations()
        self.check_orders()
        self.check_redis_ops()
        self.check_dead_letters()
        self.check_http()
        return self.anomalies

    def check_reads(self):
        n = 0
        for resp in self.responses:
            if resp.get("op_kind") != "stock_read" or resp.get("status") != 200:
                continue
            redis = (resp.get("body") or {}).get("redis")
            if not redis:
                continue
            n += 1
            bad = {k: redis[k] for k in ("available", "reserved", "sold", "deficit") if redis.get(k, 0) < 0}
            if bad:
                req = self.requests.get(resp["op"], {})
                self.add("oversell.read", {"bucket": req.get("bucket"), "op": resp["op"]},
                         f"read at {resp['wall']} saw {redis}")
        for rec in self.records:
            if rec["kind"] != "redis_read" or not rec.get("stock"):
                continue
            n += 1
            st = rec["stock"]
            bad = {k: st[k] for k in ("available", "reserved", "sold", "deficit") if int(st.get(k, 0) or 0) < 0}
            if bad:
                self.add("oversell.read", {"bucket": rec["bucket"], "seq": rec["seq"]},
                         f"direct Redis read at {rec['wall']} saw {st}")
        self.stats["stock reads checked"] = n

    def check_buckets(self):
        buckets = set(self.baseline) | set(self.stock) | set(self.snap)
        closes = collections.Counter()
        for w in self.wal:
            if WAL_ACTION.get(w["action"]) in ("CLOSE", "ARCHIVE") and w["status"] == codes.WAL_SUCCEEDED:
                closes[w["stock_bucket_id"]] += 1
        for b in sorted(buckets):
            rs = self.stock.get(b)
            led = self.ledger_by_bucket.get(b, [])
            snap = self.snap.get(b)
            redis_view = None
            if rs is not None:
                redis_view = {k: int(rs.get(k, 0) or 0) for k in ("total", "available", "reserved", "sold",
                                                                   "deficit", "version")}
                neg = {k: v for k, v in redis_view.items() if v < 0}
                if neg or redis_view["available"] + redis_view["reserved"] + redis_view["sold"] != \
                        redis_view["total"] + redis_view["deficit"]:
                    self.add("oversell.redis", {"bucket": b}, f"redis {redis_view}: negative {neg} or "
                             "available+reserved+sold != total+deficit")
            # the ledger, summed and replayed in version order
            led_view = {"total": 0, "available": 0, "reserved": 0, "sold": 0, "version": 0}
            path_bad = None
            for row in sorted(led, key=lambda r: (num(r["redis_version"]) or 0, r["id"])):
                led_view["total"] += int(row["total_delta"])
                led_view["available"] += int(row["available_delta"])
                led_view["reserved"] += int(row["reserved_delta"])
                led_view["sold"] += int(row["sold_delta"])
                led_view["version"] = max(led_view["version"], num(row["redis_version"]) or 0)
                if path_bad is None and min(led_view["available"], led_view["reserved"], led_view["sold"]) < 0:
                    path_bad = (row["operation_id"], num(row["redis_version"]), dict(led_view))
            if path_bad:
                self.add("oversell.ledger_path", {"bucket": b, "operation_id": path_bad[0]},
                         f"after version {path_bad[1]} the ledger sums to {path_bad[2]}")
            # reservation-derived
            rv = {"reserved": 0, "sold": 0}
            for rid in (r for r, row in self.res.items() if row["stock_bucket_id"] == b):
                row = self.res[rid]
                st = STATUS.get(row["status"])
                held = int(row["quantity"]) - int(row["refunded_quantity"])
                if st in HOLDING:
                    rv["reserved"] += held
                elif st == "CONFIRMED":
                    rv["sold"] += held
            snap_view = None
            if snap is not None:
                snap_view = {"total": int(snap["total_stock"]), "available": int(snap["available_stock"]),
                             "reserved": int(snap["reserved_stock"]), "sold": int(snap["sold_stock"]),
                             "deficit": int(snap["deficit_stock"]), "version": int(snap["redis_version"])}
            views = {"redis": redis_view, "ledger": led_view, "snapshot": snap_view, "reservations": rv}
            diffs = []
            if redis_view is None:
                if led or snap:
                    diffs.append("no Redis stock key although the ledger/snapshot know the bucket")
            else:
                for k in ("total", "available", "reserved", "sold"):
                    if led and led_view[k] != redis_view[k]:
                        diffs.append(f"ledger {k} {led_view[k]} != redis {redis_view[k]}")
                    if snap_view and snap_view[k] != redis_view[k]:
                        diffs.append(f"snapshot {k} {snap_view[k]} != redis {redis_view[k]}")
                if snap_view and snap_view["deficit"] != redis_view["deficit"]:
                    diffs.append(f"snapshot deficit {snap_view['deficit']} != redis {redis_view['deficit']}")
                for k in ("reserved", "sold"):
                    if rv[k] != redis_view[k]:
                        diffs.append(f"reservations {k} {rv[k]} != redis {redis_view[k]}")
                if not led:
                    diffs.append("no ledger row at all")
            if snap_view and led and snap_view["version"] != led_view["version"]:
                diffs.append(f"snapshot version {snap_view['version']} != ledger max version {led_view['version']}")
            if diffs:
                self.add("stores_agree", {"bucket": b}, "; ".join(diffs) + self.divergence(b, led) +
                         f" | views {views}")
            # version coverage
            if redis_view is not None and led:
                have = {num(r["redis_version"]) for r in led if r["redis_version"] is not None}
                missing = sorted(set(range(1, redis_view["version"] + 1)) - have)
                if len(missing) > closes.get(b, 0):
                    self.add("ledger_versions", {"bucket": b},
                             f"Redis version {redis_view['version']}; versions without a ledger row {missing[:20]}"
                             f"{'...' if len(missing) > 20 else ''} ({len(missing)}; close/archive explain "
                             f"{closes.get(b, 0)})")
            # sold + reserved never above a total the merchant asked for
            p = self.plan.get(b)
            if p and redis_view is not None:
                cap = max(p["totals"])
                if redis_view["sold"] + redis_view["reserved"] > cap:
                    self.add("oversell.total", {"bucket": b},
                             f"sold {redis_view['sold']} + reserved {redis_view['reserved']} > largest total "
                             f"ever requested {cap} (totals {p['totals']})")
        self.stats["buckets checked"] = len(buckets)

    def divergence(self, bucket, led):
        """Where the ledger first parts from Redis: each ledger row's running sums against the
        absolute numbers its Redis op record stored at the same version."""
        run = {"total": 0, "available": 0, "reserved": 0, "sold": 0}
        for row in sorted(led, key=lambda r: (num(r["redis_version"]) or 0, r["id"])):
            run["total"] += int(row["total_delta"])
            run["available"] += int(row["available_delta"])
            run["reserved"] += int(row["reserved_delta"])
            run["sold"] += int(row["sold_delta"])
            rec = self.ops.get(row["operation_id"])
            if rec is None or rec.get("version") is None or int(rec["version"]) != num(row["redis_version"]):
                continue
            redis_now = {k: int(rec.get(k, 0) or 0) for k in run}
            if redis_now != run:
                return (f"; first divergence at version {row['redis_version']}: ledger "
                        f"{LEDGER_ACTION.get(row['action'])} op {row['operation_id']} (quantity {row['quantity']}, "
                        f"deltas available {row['available_delta']} reserved {row['reserved_delta']} sold "
                        f"{row['sold_delta']} total {row['total_delta']}) leaves the ledger at {run} while Redis "
                        f"recorded {redis_now} (deficit {rec.get('deficit')})")
        return ""

    def failed_before(self, order_id, mono):
        """Whether an OrderCreatedFailed of the order was acknowledged by Kafka before `mono`."""
        return any(a.get("event_type") == "OrderCreatedFailed" and a.get("order_id") == order_id
                   and a["mono"] <= mono for a in self.acked.values())

    def check_tries(self):
        answered = {}  # reservation_id -> (status answered, op)
        for resp in self.responses:
            kind = resp.get("op_kind")
            if resp.get("status") not in (200, 201) or kind not in ("try", "try_order"):
                continue
            body = resp.get("body") or {}
            for it in body.get("items", []) if kind == "try_order" else []:
                err = it.get("error") or {}
                if err.get("error") == "order_failed" and self.failed_before(body.get("order_id"), resp["mono"]):
                    continue  # the order fence refused a late Try (issue 9.1): the contract
                if err and err.get("error") not in ("unavailable", "mysql_unavailable", "redis_unavailable",
                                                    "bucket_not_found", "bucket_unavailable", "bucket_lost",
                                                    "invalid_request"):
                    # Name what became of a reservation the error message mentions.
                    fate = ""
                    m = re.search(r"reservation (\d+)", err.get("message", ""))
                    if m:
                        row = self.res.get(int(m.group(1)))
                        fate = (f"; reservation {m.group(1)} exists, final status "
                                f"{STATUS.get(row['status'])}" if row else f"; no row {m.group(1)}")
                    self.add("api_error", {"op": resp["op"], "order_id": body.get("order_id"),
                                           "order_item_id": it.get("order_item_id")},
                             f"item error inside a 200 order answer at {resp['wall']}: {err}{fate}")
            if kind == "try":
                views = [body.get("reservation")]
            else:
                views = [i.get("reservation") for i in body.get("items", [])]
            for v in views:
                if v:
                    answered.setdefault(int(v["reservation_id"]), (v["status"], resp["op"], v))
        n_res = n_rej = 0
        for rid, (st, op, v) in answered.items():
            row = self.res.get(rid)
            ids = {"reservation_id": rid, "order_id": v.get("order_id"), "op": op}
            if st == "RESERVED":
                n_res += 1
                if row is None:
                    self.add("durability", ids, "Try answered RESERVED but no reservation row exists")
                    continue
                now = STATUS.get(row["status"])
                tries = [r for r in self.ledger_by_res.get(rid, []) if r["action"] == codes.LEDGER_TRY]
                if now in ("PREPARING", "REJECTED", None):
                    self.add("durability", ids, f"Try answered RESERVED but the row is {now}")
                elif not tries and not (now == "CANCELED" and self.is_empty_rollback(rid)):
                    self.add("durability", ids, f"Try answered RESERVED (row now {now}) but the ledger has no "
                                                "TRY row for it")
            elif st == "REJECTED":
                n_rej += 1
                if row is None or STATUS.get(row["status"]) != "REJECTED":
                    self.add("durability", ids, f"Try answered REJECTED but the row is "
                                                f"{None if row is None else STATUS.get(row['status'])}")
        self.stats["Trys answered RESERVED"] = n_res
        self.stats["Trys answered REJECTED"] = n_rej

    def is_empty_rollback(self, rid):
        f = self.fence.get(rid) or {}
        return f.get("phase") == "CANCELED" and not f.get("try_op")

    def check_reservations(self):
        alerted = dead = 0
        for rid, row in self.res.items():
            st = STATUS.get(row["status"], str(row["status"]))
            ids = {"reservation_id": rid, "order_id": int(row["order_id"]), "bucket": row["stock_bucket_id"]}
            q, refunded = int(row["quantity"]), int(row["refunded_quantity"])
            if st not in TERMINAL:
                if row["dead"]:
                    dead += 1
                elif row.get("stale_alerted_at") is not None and st == "RESERVED":
                    alerted += 1
                else:
                    self.add("not_terminal", ids, f"status {st}, dead={row['dead']}, stale_alerted_at="
                                                  f"{row.get('stale_alerted_at')}, last_error={row.get('last_error')}")
            # ledger rows of this reservation against its final status
            led = self.ledger_by_res.get(rid, [])
            cnt = collections.Counter(LEDGER_ACTION.get(r["action"]) for r in led)
            refund_sum = sum(int(r["quantity"]) for r in led if r["action"] == codes.LEDGER_REFUND)
            reserved_sum = sum(int(r["reserved_delta"]) for r in led)
            sold_sum = sum(int(r["sold_delta"]) for r in led)
            exp_reserved = q - refunded if st in HOLDING else 0
            exp_sold = q - refunded if st == "CONFIRMED" else 0
            problems = []
            for a in ("TRY", "CONFIRM", "CANCEL"):
                if cnt[a] > 1:
                    problems.append(f"{cnt[a]} {a} rows")
            if st in (*HOLDING, "CONFIRMED", "REFUNDED") and cnt["TRY"] != 1:
                problems.append(f"{cnt['TRY']} TRY rows for a {st} reservation")
            if st == "REJECTED" and (cnt["TRY"] or cnt["CONFIRM"] or cnt["CANCEL"]):
                problems.append(f"REJECTED but ledger has {dict(cnt)}")
            if st == "CANCELED" and cnt["TRY"] != cnt["CANCEL"] and not self.is_empty_rollback(rid):
                problems.append(f"CANCELED with {cnt['TRY']} TRY and {cnt['CANCEL']} CANCEL rows")
            if refund_sum != refunded:
                problems.append(f"refund rows sum to {refund_sum}, refunded_quantity {refunded}")
            if st in (*HOLDING, "CONFIRMED", "CANCELED", "REFUNDED", "REJECTED") and \
                    (reserved_sum != exp_reserved or sold_sum != exp_sold):
                problems.append(f"ledger deltas reserved {reserved_sum} sold {sold_sum}, status {st} holds "
                                f"reserved {exp_reserved} sold {exp_sold}")
            if problems:
                self.add("applied_once", ids, "; ".join(problems) + f" (ledger ops "
                         f"{[(LEDGER_ACTION.get(r['action']), r['operation_id']) for r in led]})")
            # the Redis fence
            f = self.fence.get(rid)
            exp_phase = {"RESERVED": "RESERVED", "CREATED_RESERVED": "RESERVED", "CONFIRMED": "CONFIRMED",
                         "CANCELED": "CANCELED", "REFUNDED": "REFUNDED"}.get(st)
            if exp_phase:
                if f is None:
                    self.add("fence", ids, f"status {st} but no Redis fence")
                elif f.get("phase") != exp_phase and not (st == "CANCELED" and f.get("phase") is None):
                    self.add("fence", ids, f"status {st} but fence {f}")
                elif int(f.get("refunded", 0) or 0) != refunded:
                    self.add("fence", ids, f"refunded_quantity {refunded} but fence refunded {f.get('refunded')}")
        dup = [op for op, rows in self.ledger_by_op.items() if len(rows) > 1]
        for op in dup:
            self.add("applied_once", {"operation_id": op}, f"{len(self.ledger_by_op[op])} ledger rows")
        for rf in self.refunds:
            if rf["status"] == codes.REFUND_DONE and len(self.ledger_by_op.get(rf["operation_id"], [])) != 1:
                self.add("applied_once", {"reservation_id": int(rf["reservation_id"]), "refund_key": rf["refund_key"],
                                          "operation_id": rf["operation_id"]},
                         f"refund DONE booked {len(self.ledger_by_op.get(rf['operation_id'], []))} times")
        self.stats["reservations alerted stale"] = alerted
        self.stats["reservations dead"] = dead

    def check_orders(self):
        """Final status against what the acknowledged events of each order imply."""
        checked = skipped = 0
        for oid, o in self.orders.items():
            events = o.get("events") or []
            if any(e["event_id"] not in self.acked for e in events):
                skipped += 1
                continue
            rows = self.by_order.get(oid, [])
            fate = o["fate"]
            if fate in ("failed", "rejected", "try_failed", "late_try"):
                for rid in rows:
                    st = STATUS.get(self.res[rid]["status"])
                    if st in HOLDING:
                        self.add("hanging", {"reservation_id": rid, "order_id": oid},
                                 f"{st} although OrderCreatedFailed was acknowledged (fate {fate}); "
                                 f"its stock stays held")
                    elif st not in ("CANCELED", "REJECTED"):
                        self.add("order_outcome", {"reservation_id": rid, "order_id": oid},
                                 f"{st}, expected CANCELED (OrderCreatedFailed, fate {fate})")
                checked += 1
                continue
            refunded = collections.Counter()
            for e in events:
                if e["event_type"] == "RefundRequested":
                    for it in e["data"]["items"]:
                        refunded[int(it["inventory_reservation_id"])] += int(it["quantity"])
            for item in o["items"]:
                if item.get("status") != "RESERVED":
                    continue
                rid = int(item["reservation_id"])
                row = self.res.get(rid)
                if row is None:
                    continue  # reported by durability
                st = STATUS.get(row["status"])
                q = int(row["quantity"])
                if fate == "canceled":
                    exp_st, exp_ref = "REFUNDED", q
                else:
                    exp_ref = min(q, refunded[rid])
                    exp_st = "REFUNDED" if exp_ref == q else "CONFIRMED"
                if st != exp_st or int(row["refunded_quantity"]) != exp_ref:
                    self.add("order_outcome", {"reservation_id": rid, "order_id": oid},
                             f"{st} refunded {row['refunded_quantity']}, expected {exp_st} refunded {exp_ref} "
                             f"(fate {fate}, {o['order_type']}, events "
                             f"{[e['event_type'] for e in sorted(events, key=lambda e: e['due'])]})")
            checked += 1
        self.stats["orders checked"] = checked
        self.stats["orders not checked (an event unacknowledged)"] = skipped

    def check_redis_ops(self):
        # A bucket rebuilt after Redis lost it (fault redis-empty) starts again from MySQL: the
        # op records of what came before are gone, except those the rebuild restores (the
        # steps of reservations still holding units) at the rebuild's version.
        rebuilt = collections.defaultdict(set)
        for row in self.ledger:
            if LEDGER_ACTION.get(row["action"]) == "REBUILD" and row["redis_version"] is not None:
                rebuilt[row["stock_bucket_id"]].add(int(row["redis_version"]))
        for op, rows in self.ledger_by_op.items():
            rec = self.ops.get(op)
            row = rows[0]
            before_rebuild = row["redis_version"] is not None and any(
                int(row["redis_version"]) < v for v in rebuilt.get(row["stock_bucket_id"], ()))
            if before_rebuild and (rec is None or int(rec.get("version", -1)) in rebuilt[row["stock_bucket_id"]]):
                continue
            if rec is None:
                self.add("redis_ops", {"operation_id": op, "bucket": row["stock_bucket_id"],
                                       "reservation_id": num(row["reservation_id"])},
                         f"ledger {LEDGER_ACTION.get(row['action'])} row at version {row['redis_version']} "
                         "has no Redis op record")
            elif row["redis_version"] is not None and int(rec.get("version", -1)) != int(row["redis_version"]):
                self.add("redis_ops", {"operation_id": op, "bucket": row["stock_bucket_id"]},
                         f"ledger version {row['redis_version']} but Redis op record version {rec.get('version')}")
        versions = collections.defaultdict(set)
        for row in self.ledger:
            if row["redis_version"] is not None:
                versions[row["stock_bucket_id"]].add(int(row["redis_version"]))
        moving = {"TRY", "CONFIRM", "CANCEL", "REFUND", "ADJUST", "INIT"}
        for op, rec in self.ops.items():
            if rec.get("code") != "SUCCEEDED" or rec.get("action") not in moving or op in self.ledger_by_op:
                continue
            v = int(rec.get("version", 0) or 0)
            # A SUCCEEDED answer without a move (a Try the fence already holds, an empty rollback)
            # reports the version some other operation produced: not a gap.
            if v in versions.get(rec["bucket"], set()) or rec.get("empty_rollback") == "1":
                continue
            self.add("redis_ops", {"operation_id": op, "bucket": rec["bucket"],
                                   "reservation_id": rec.get("reservation_id")},
                     f"Redis {rec.get('action')} SUCCEEDED at version {v} has no ledger row (ledger gap)")

    def check_dead_letters(self):
        intended = {pos: a for pos, a in self.acks_by_pos.items() if a.get("intended_dlt")}
        parked = set()
        for d in self.dead:
            pos = (d["original_topic"], int(d["original_partition"]), int(d["original_offset"]))
            parked.add(pos)
            if pos in intended:
                continue
            ev = self.acks_by_pos.get(pos, {})
            key = d["record_key"]
            if isinstance(key, (bytes, bytearray)):
                key = key.decode(errors="replace")
            self.add("dead_letter.unintended",
                     {"dead_letter_id": int(d["id"]), "origin": f"{pos[0]}:{pos[1]}@{pos[2]}", "key": key,
                      "event_id": ev.get("event_id"), "event_type": ev.get("event_type")},
                     f"{d['error_class']} from {d['consumer_group']}: {d['error_message'][:300]}")
        for pos, a in intended.items():
            if pos not in parked:
                self.add("dead_letter.missing", {"event_id": a["event_id"], "origin": f"{pos[0]}:{pos[1]}@{pos[2]}"},
                         f"invalid record ({a.get('intended_dlt')}) was not parked")
        self.stats["intended dead letters"] = len(intended)

    def check_http(self):
        for resp in self.responses:
            st = resp.get("status") or 0
            if st >= 500 and st != 503:
                req = self.requests.get(resp["op"], {})
                self.add("http_5xx", {"op": resp["op"], "path": req.get("path"), "order_id": req.get("order_id")},
                         f"HTTP {st}: {str(resp.get('body'))[:300]}")
