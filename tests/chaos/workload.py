"""The seeded workload: an order service and merchants driving stocksvr.

* Trys through the HTTP API (single items and multi-dish orders) on a few hot buckets (small
  totals: they sell out, get adjusted, sell out again) and many cold ones, each retried like an
  order service would (same body, on a timeout, a 5xx or a refused connection, until a
  deadline), alternating between the two API processes.
* The order events that follow, produced by the stock Python confluent-kafka producer with the
  Confluent AvroSerializer (TopicRecordNameStrategy, as tests/interop/produce.py): OrderCreated
  only after every item's Try was answered RESERVED; OrderCreatedFailed when a Try was rejected
  or never answered (carrying the ids it knows); OrderCanceled and RefundRequested after
  OrderCreated; immediate and late duplicates (same event id and bytes); late events; and, rarely,
  a RefundRequested published before its OrderCreated (issue 9.3: early events must wait).
* Merchant operations through /admin/buckets: adjusts of hot buckets, new buckets, closes.
* A few deliberately invalid records (garbage bytes, an unknown schema id, an OrderCreated that
  names another order's reservation), recorded as intended dead letters with their offsets.
* Reads of the stock numbers, kept for the no-oversell check.

Every decision comes from random.Random seeded with the run seed and the order index, so a seed
gives the same orders, fates and events; timing (and so the interleaving with faults) varies.
"""

import datetime as dt
import heapq
import random
import struct
import threading
import time

import requests
from confluent_kafka import KafkaException

from stocksvr_harness import avro

TOPIC = "order.lifecycle.v1"
RESERVED = "RESERVED"


def utc_now():
    return dt.datetime.now(dt.timezone.utc)


rfc3339 = avro.rfc3339


def noon_zone(utc_hour):
    """(IANA name, tzinfo) of the whole-hour zone where it is 12:xx while it is `utc_hour`:xx in
    UTC. The merchants' business day (their bucket's date) is computed in their zone; in UTC a
    run across midnight made today's buckets and then tried against tomorrow's, which do not
    exist. From noon a run would have to last about eleven hours to see the day change."""
    offset = 12 - utc_hour  # -11..12
    # The Etc zones keep POSIX signs, inverted: Etc/GMT-5 is five hours AHEAD of UTC.
    name = "Etc/GMT" if offset == 0 else f"Etc/GMT{-offset:+d}"
    return name, dt.timezone(dt.timedelta(hours=offset), name)


# ---- HTTP ---------------------------------------------------------------------------------


class Http:
    """requests with one session per thread; every call is recorded (request, then response or
    timeout) under one op id."""

    def __init__(self, history, timeout):
        self.history = history
        self.timeout = timeout
        self._local = threading.local()

    def _session(self):
        s = getattr(self._local, "s", None)
        if s is None:
            s = requests.Session()
            self._local.s = s
        return s

    def call(self, op_kind, client, method, base, path, body=None, **extra):
        op = self.history.next_op()
        self.history.record("request", op=op, op_kind=op_kind, client=client, method=method, base=base,
                            path=path, body=body, **extra)
        t0 = time.monotonic()
        try:
            r = self._session().request(method, base + path, json=body, timeout=self.timeout)
        except requests.RequestException as e:
            self.history.record("timeout", op=op, op_kind=op_kind, client=client,
                                error=f"{type(e).__name__}: {str(e)[:300]}",
                                seconds=round(time.monotonic() - t0, 3))
            # A broken keep-alive connection must not poison the next request.
            self._local.s = None
            return None, None
        try:
            data = r.json()
        except ValueError:
            data = {"text": r.text[:500]}
        self.history.record("response", op=op, op_kind=op_kind, client=client, status=r.status_code,
                            body=data, seconds=round(time.monotonic() - t0, 3))
        return r.status_code, data


# ---- Kafka --------------------------------------------------------------------------------


class EventProducer:
    """Produces order events at their due time (monotonic), in (due, scheduling order), which
    keeps the order of one order's events: they share a key, so a partition, and one idempotent
    producer keeps the order within a partition."""

    def __init__(self, history, bootstrap, registry_url, clients=None, producer=None):
        self.history = history
        # clients: a secure stack's client settings (stocksvr_harness.secure): the producer is
        # the `order-service` principal, which may only write the order topic.
        kafka = clients.kafka("order-service") if clients else {}
        # The order service's outbox would retry for ever; 10 minutes covers any fault here.
        # (`producer`: a stand-in for the harness's own tests.)
        self.producer = producer or avro.order_producer(bootstrap, "chaos-order-service", security=kafka,
                                                        linger_ms=5, message_timeout_ms=600000)
        self.serializers = None if producer else avro.Serializers(
            registry_url, registry_conf=clients.registry() if clients else None)
        self._heap = []
        self._seq = 0
        self._cv = threading.Condition()
        self._drain = None  # the deadline of the final flush, once finish() asks for it
        self._flushed = False
        self._unflushed = 0
        self._stop = False
        self.acked = 0
        self.failed = 0
        self._inflight = 0
        self._thread = threading.Thread(target=self._loop, name="producer", daemon=True)

    def serialize(self, event_type, payload):
        return self.serializers.value(event_type, payload, TOPIC)

    def start(self):
        self._thread.start()

    def schedule(self, due, ev):
        """ev: event_id, event_type, order_id, value (bytes), plus fields copied to the history."""
        with self._cv:
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, ev))
            self._cv.notify()

    def _loop(self):
        # Only this thread touches the producer: librdkafka's Python client may crash the
        # process when two threads serve its callbacks at once (a flush in one while another
        # polls), which a CI run met as exit 139 right after the workload.
        while True:
            batch = []
            with self._cv:
                while not self._stop:
                    now = time.monotonic()
                    if self._heap and (self._drain or self._heap[0][0] <= now):
                        break
                    if self._drain and not self._heap:
                        break
                    wait = 0.05 if not self._heap else min(0.05, max(0.0, self._heap[0][0] - now))
                    self._cv.wait(wait)
                    self.producer.poll(0)
                if self._stop:
                    return
                if self._drain and not self._heap:
                    end = self._drain
                    self._cv.release()
                    try:
                        self._unflushed = self.producer.flush(max(0.0, end - time.monotonic()))
                    finally:
                        self._cv.acquire()
                    self._flushed = True
                    self._cv.notify_all()
                    return
                now = time.monotonic()
                while self._heap and (self._drain or self._heap[0][0] <= now):
                    batch.append(heapq.heappop(self._heap)[2])
            for ev in batch:
                self._produce(ev)
            self.producer.poll(0)

    def _produce(self, ev):
        meta = {k: v for k, v in ev.items() if k != "value"}
        self.history.record("produce", topic=TOPIC, **meta)

        def on_delivery(err, msg, meta=meta):
            with self._cv:
                self._inflight -= 1
            if err is not None:
                self.failed += 1
                self.history.record("produce_error", event_id=meta["event_id"], error=str(err),
                                    dup=meta.get("dup", False))
            else:
                self.acked += 1
                self.history.record("produce_ack", event_id=meta["event_id"], topic=msg.topic(),
                                    partition=msg.partition(), offset=msg.offset(),
                                    event_type=meta.get("event_type"), order_id=meta.get("order_id"),
                                    dup=meta.get("dup", False), intended_dlt=meta.get("intended_dlt"))

        with self._cv:
            self._inflight += 1
        while True:
            try:
                self.producer.produce(TOPIC, key=str(ev["order_id"]).encode(), value=ev["value"],
                                      on_delivery=on_delivery)
                return
            except BufferError:
                self.producer.poll(0.5)
            except KafkaException as e:
                with self._cv:
                    self._inflight -= 1
                self.failed += 1
                self.history.record("produce_error", event_id=ev["event_id"], error=str(e))
                return

    def finish(self, deadline_s):
        """Produce everything still scheduled now (keeping its order) and wait for the acks.
        Returns the number of events not acknowledged by the deadline."""
        end = time.monotonic() + deadline_s
        with self._cv:
            # The producer thread hands over what is left, flushes until `end`, and stops.
            self._drain = end
            self._cv.notify()
            self._cv.wait_for(lambda: self._flushed, timeout=max(0.0, end - time.monotonic()) + 5)
            self._stop = True
            self._cv.notify()
            left = len(self._heap) + self._inflight
            unflushed = self._unflushed if self._flushed else left
        self._thread.join(timeout=5)
        return max(left, unflushed)


# ---- the model ----------------------------------------------------------------------------


class Bucket:
    def __init__(self, merchant, dish, date, total, hot):
        self.merchant = merchant
        self.dish = dish
        self.date = date  # datetime.date
        self.hot = hot
        self.totals = [total]  # every total requested for it (init, then adjusts)
        self.open = True

    @property
    def bucket_id(self):
        return f"bucket_{self.merchant}_{self.dish}_{self.date.strftime('%Y%m%d')}"


class Config:
    def __init__(self, ci=False):
        self.workers = 4 if ci else 6
        self.merchants = (501, 502, 503)
        self.hot_per_merchant = 2
        self.cold_per_merchant = 8
        self.hot_total = 40
        self.cold_total = 400
        self.p_hot = 0.5
        self.p_multi = 0.3
        self.p_scheduled = 0.2
        self.scheduled_delay = (5.0, 30.0) if ci else (5.0, 45.0)
        self.p_failed = 0.15
        self.p_cancel = 0.15
        self.p_refund = 0.2
        self.p_early_refund = 0.03
        # The order service gave up on the order (OrderCreatedFailed without ids) before its Try
        # reached stocksvr: a Try delayed in the network arrives after the failure (issue 9.1).
        self.p_late_try = 0.01
        self.late_try_delay = (2.0, 5.0)
        self.p_late = 0.05
        self.late_delay = (10.0, 25.0) if ci else (15.0, 45.0)
        self.p_dup = 0.12
        self.p_late_dup = 0.08
        self.try_deadline = 15.0
        self.http_timeout = 5.0
        self.order_pause = (0.0, 0.4)
        self.merchant_tick = (2.0, 6.0)
        self.max_closes = 2
        self.max_invalid = 6 if ci else 20
        # Scale-out runs (issue 14): stop starting orders after this many (None: until the end
        # of --minutes); Try requests round-robin over the API processes by order number.
        self.max_orders = None
        self.round_robin = False


class Workload:
    def __init__(self, history, api_bases, producer, seed, cfg, date, zone, redis_direct=None):
        self.history = history
        self.api_bases = list(api_bases)
        self.producer = producer
        self.seed = seed
        self.cfg = cfg
        self.date = date  # the merchants' business day in `zone` (a tzinfo)
        self.zone = zone
        self.http = Http(history, cfg.http_timeout)
        # A Redis client straight to the server: reads of the stock hash that do not depend on
        # stocksvr answering (the no-oversell check looks at both kinds of reads).
        self.redis_direct = redis_direct
        self.lock = threading.Lock()
        self.buckets = {}  # bucket_id -> Bucket
        self.stop_event = threading.Event()
        self.order_index = 0
        self.next_dish = {}
        self.reserved_ids = []  # (order_id, reservation_id) answered RESERVED
        self.invalid_sent = 0
        self.closes = 0
        self.threads = []
        self.counts = {}

    def count(self, key, n=1):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    # ---- buckets ------------------------------------------------------------------------

    def plan_buckets(self):
        rng = random.Random(f"{self.seed}:buckets")
        for m in self.cfg.merchants:
            for j in range(self.cfg.hot_per_merchant + self.cfg.cold_per_merchant):
                hot = j < self.cfg.hot_per_merchant
                total = self.cfg.hot_total + rng.randint(-10, 10) if hot else self.cfg.cold_total
                b = Bucket(m, m * 1000 + j + 1, self.date, total, hot)
                self.buckets[b.bucket_id] = b
            self.next_dish[m] = m * 1000 + 500
        return list(self.buckets.values())

    def open_buckets(self, merchant):
        with self.lock:
            return [b for b in self.buckets.values() if b.merchant == merchant and b.open]

    # ---- events -------------------------------------------------------------------------

    def envelope(self, event_type, event_id, order_id, data):
        return avro.envelope(event_type, event_id, order_id, data, "chaos-order-service")

    def emit(self, due, event_type, order_id, data, rng, label, n):
        """Schedule one event (plus its duplicates) `due` seconds from now."""
        event_id = f"chaos-{self.seed}-{order_id}-{label}-{n}"
        value = self.producer.serialize(event_type, self.envelope(event_type, event_id, order_id, data))
        base = time.monotonic() + due
        ev = {"event_id": event_id, "event_type": event_type, "order_id": order_id, "value": value,
              "label": label, "dup": False, "intended_dlt": None}
        self.producer.schedule(base, ev)
        self.count(f"event {event_type}")
        if rng.random() < self.cfg.p_dup:
            self.producer.schedule(base, dict(ev, dup=True))
            self.count("event duplicate (immediate)")
        if rng.random() < self.cfg.p_late_dup:
            self.producer.schedule(base + rng.uniform(3.0, 20.0), dict(ev, dup=True))
            self.count("event duplicate (late)")
        return {"event_id": event_id, "event_type": event_type, "due": round(due, 3), "data": data}

    # ---- orders -------------------------------------------------------------------------

    def next_order(self):
        with self.lock:
            self.order_index += 1
            return self.order_index

    def order_worker(self, worker):
        rng = random.Random(f"{self.seed}:worker:{worker}")
        while not self.stop_event.is_set():
            idx = self.next_order()
            if self.cfg.max_orders is not None and idx > self.cfg.max_orders:
                return
            try:
                self.run_order(idx, worker)
            except Exception as e:  # a workload bug must not silently stop a worker
                self.history.record("workload_error", order_index=idx, error=f"{type(e).__name__}: {e}")
                self.count("workload errors")
            time.sleep(rng.uniform(*self.cfg.order_pause))

    def run_order(self, idx, worker):
        cfg = self.cfg
        rng = random.Random(f"{self.seed}:order:{idx}")
        order_id = 10_000_000 + idx
        merchant = rng.choice(cfg.merchants)
        candidates = self.open_buckets(merchant)
        hot = [b for b in candidates if b.hot]
        cold = [b for b in candidates if not b.hot]
        n = rng.randint(2, 4) if rng.random() < cfg.p_multi else 1
        picked = []
        for _ in range(n):
            pool = hot if (hot and rng.random() < cfg.p_hot) or not cold else cold
            pool = [b for b in pool if b not in picked]
            if pool:
                picked.append(rng.choice(pool))
        if not picked:
            return
        items = [{"order_item_id": order_id * 10 + k, "dish_id": b.dish, "quantity": rng.randint(1, 3),
                  "bucket": b.bucket_id} for k, b in enumerate(picked)]
        order_type = "INSTANT"
        processing_time = None
        if rng.random() < cfg.p_scheduled:
            pt = utc_now() + dt.timedelta(seconds=rng.uniform(*cfg.scheduled_delay))
            if pt.astimezone(self.zone).date() == self.date:  # a bucket exists only for today
                order_type, processing_time = "SCHEDULED", rfc3339(pt)
        api_pick = rng.randrange(len(self.api_bases))
        if cfg.round_robin:
            api_pick = idx % len(self.api_bases)

        if rng.random() < cfg.p_late_try:
            return self.late_try(rng, order_id, merchant, items, order_type, processing_time, api_pick, worker)
        outcome = self.try_items(order_id, merchant, items, order_type, processing_time, api_pick, worker)
        reserved = [i for i in items if outcome[i["order_item_id"]]["status"] == RESERVED]
        unknown = [i for i in items if outcome[i["order_item_id"]]["status"] is None]
        for i in items:
            i.update(outcome[i["order_item_id"]])
        with self.lock:
            self.reserved_ids.extend((order_id, int(i["reservation_id"])) for i in reserved)
        ids = [int(i["reservation_id"]) for i in reserved]

        events = []
        if len(reserved) < len(items):
            fate = "try_failed" if unknown else "rejected"
            events.append(self.emit(rng.uniform(0.1, 1.5), "OrderCreatedFailed", order_id,
                                    {"order_id": order_id, "merchant_id": merchant,
                                     "inventory_reservation_ids": ids,
                                     "reason": "chaos: an item was not reserved"}, rng, "failed", 1))
        elif rng.random() < cfg.p_failed:
            fate = "failed"
            events.append(self.emit(rng.uniform(0.1, 1.5), "OrderCreatedFailed", order_id,
                                    {"order_id": order_id, "merchant_id": merchant,
                                     "inventory_reservation_ids": ids,
                                     "reason": "chaos: payment failed"}, rng, "failed", 1))
        else:
            fate = "created"
            t_created = rng.uniform(*cfg.late_delay) if rng.random() < cfg.p_late else rng.uniform(0.1, 1.5)
            r = rng.random()
            refunds = []
            if r < cfg.p_cancel:
                fate = "canceled"
            elif r < cfg.p_cancel + cfg.p_refund:
                fate = "refunded"
                left = {i["reservation_id"]: i["quantity"] for i in reserved}
                for k in range(rng.randint(1, 2)):
                    choices = [rid for rid, q in left.items() if q > 0]
                    if not choices:
                        break
                    rid = rng.choice(choices)
                    q = rng.randint(1, left[rid])
                    left[rid] -= q
                    refunds.append((k + 1, [{"inventory_reservation_id": int(rid), "quantity": q}]))
            early = bool(refunds) and rng.random() < cfg.p_early_refund
            if early:
                # Issue 9.3: the refund reaches Kafka before the OrderCreated it depends on.
                fate = "refunded_early"
                t_refund = t_created
                t_created = t_refund + rng.uniform(0.3, 2.0)
            events.append(self.emit(t_created, "OrderCreated", order_id,
                                    {"order_id": order_id, "merchant_id": merchant, "order_type": order_type,
                                     "processing_time": processing_time, "inventory_reservation_ids": ids},
                                    rng, "created", 1))
            t = t_created
            if fate == "canceled":
                t += rng.uniform(0.5, 4.0)
                events.append(self.emit(t, "OrderCanceled", order_id,
                                        {"order_id": order_id, "merchant_id": merchant,
                                         "inventory_reservation_ids": ids, "reason": "chaos: user canceled"},
                                        rng, "canceled", 1))
            for k, refund_items in refunds:
                if early and k == 1:
                    due = t_refund
                else:
                    t += rng.uniform(0.5, 4.0)
                    due = t
                events.append(self.emit(due, "RefundRequested", order_id,
                                        {"order_id": order_id, "merchant_id": merchant,
                                         "refund_id": f"rf-{order_id}-{k}", "items": refund_items,
                                         "reason": None}, rng, "refund", k))
        self.count(f"order fate {fate}")
        self.history.record("order", order_id=order_id, merchant_id=merchant, fate=fate, order_type=order_type,
                            processing_time=processing_time, items=items, events=events)

    def late_try(self, rng, order_id, merchant, items, order_type, processing_time, api_pick, worker):
        """OrderCreatedFailed (no reservation ids: the order service never got any) first, the
        Try a few seconds later. The stock must not end up held: the late Try should be refused
        (issue 9.1 asks for a 409), or at least cancelled."""
        failed = self.emit(0.0, "OrderCreatedFailed", order_id,
                           {"order_id": order_id, "merchant_id": merchant, "inventory_reservation_ids": [],
                            "reason": "chaos: the order timed out before its Try arrived"}, rng, "failed", 1)
        self.stop_event.wait(rng.uniform(*self.cfg.late_try_delay))
        outcome = self.try_items(order_id, merchant, items, order_type, processing_time, api_pick, worker)
        for i in items:
            i.update(outcome[i["order_item_id"]])
        self.count("order fate late_try")
        self.history.record("order", order_id=order_id, merchant_id=merchant, fate="late_try", order_type=order_type,
                            processing_time=processing_time, items=items, events=[failed])

    def try_items(self, order_id, merchant, items, order_type, processing_time, api_pick, worker):
        """Try until every item has a definite answer or the deadline passed. Returns
        order_item_id -> {status, reservation_id, http}."""
        out = {i["order_item_id"]: {"status": None, "reservation_id": None, "http": None} for i in items}
        deadline = time.monotonic() + self.cfg.try_deadline
        backoff = 0.3
        attempt = 0
        single = len(items) == 1
        while True:
            pending = [i for i in items if out[i["order_item_id"]]["http"] is None]
            if not pending or time.monotonic() > deadline or (self.stop_event.is_set() and attempt > 0):
                return out
            base = self.api_bases[(api_pick + attempt) % len(self.api_bases)]
            attempt += 1
            if single:
                it = items[0]
                body = {"order_id": order_id, "order_item_id": it["order_item_id"], "merchant_id": merchant,
                        "dish_id": it["dish_id"], "quantity": it["quantity"], "order_type": order_type}
                if processing_time:
                    body["processing_time"] = processing_time
                self.count("try single")
                status, data = self.http.call("try", f"w{worker}", "POST", base, "/v1/reservations", body,
                                              order_id=order_id, attempt=attempt)
                if status in (200, 201):
                    res = data["reservation"]
                    out[it["order_item_id"]] = {"status": res["status"], "reservation_id": res["reservation_id"],
                                                "http": status}
                elif status is not None and 400 <= status < 500:
                    out[it["order_item_id"]] = {"status": f"HTTP_{status}", "reservation_id": None, "http": status}
            else:
                body = {"merchant_id": merchant, "order_type": order_type,
                        "items": [{"order_item_id": i["order_item_id"], "dish_id": i["dish_id"],
                                   "quantity": i["quantity"]} for i in pending]}
                if processing_time:
                    body["processing_time"] = processing_time
                self.count("try order")
                status, data = self.http.call("try_order", f"w{worker}", "POST", base,
                                              f"/v1/orders/{order_id}/reservations", body,
                                              order_id=order_id, attempt=attempt)
                if status == 200:
                    for it in data.get("items", []):
                        key = it["order_item_id"]
                        if it.get("reservation"):
                            out[key] = {"status": it["reservation"]["status"],
                                        "reservation_id": it["reservation"]["reservation_id"], "http": 200}
                        elif it.get("error"):
                            err = it["error"].get("error", "")
                            # Unavailable (503-class) items are retried; others are definite.
                            if err not in ("unavailable", "mysql_unavailable", "redis_unavailable",
                                           "service_unavailable", "internal", "inconsistent"):
                                out[key] = {"status": f"ERROR_{err}", "reservation_id": None, "http": 200}
                elif status is not None and 400 <= status < 500:
                    for i in pending:
                        out[i["order_item_id"]] = {"status": f"HTTP_{status}", "reservation_id": None,
                                                   "http": status}
            if any(out[i["order_item_id"]]["http"] is None for i in items):
                time.sleep(backoff)
                backoff = min(2.0, backoff * 2)

    # ---- merchants, invalid records, reads ----------------------------------------------

    def merchant_loop(self):
        rng = random.Random(f"{self.seed}:merchant")
        # One of each invalid kind early, so even a short run checks that they are parked.
        forced = ["garbage", "unknown_schema", "foreign_ids"]
        while not self.stop_event.wait(rng.uniform(*self.cfg.merchant_tick)):
            if forced:
                self.send_invalid(forced.pop(0), rng)
                continue
            r = rng.random()
            if r < 0.45:
                self.adjust(rng)
            elif r < 0.7:
                self.new_bucket(rng)
            elif r < 0.8:
                self.close(rng)
            elif self.invalid_sent < self.cfg.max_invalid:
                self.send_invalid(rng.choice(["garbage", "unknown_schema", "foreign_ids"]), rng)

    def admin(self, op_kind, rng, path, body):
        base = rng.choice(self.api_bases)
        self.count(f"merchant {op_kind}")
        return self.http.call(op_kind, "merchant", "POST", base, path, body)

    def adjust(self, rng):
        with self.lock:
            hot = [b for b in self.buckets.values() if b.hot and b.open]
        if not hot:
            return
        b = rng.choice(hot)
        total = max(0, b.totals[-1] + rng.randint(-8, 20))
        with self.lock:
            b.totals.append(total)
        self.admin("adjust", rng, f"/admin/buckets/{b.bucket_id}/adjust", {"total": total})

    def new_bucket(self, rng):
        m = rng.choice(self.cfg.merchants)
        with self.lock:
            self.next_dish[m] += 1
            dish = self.next_dish[m]
        b = Bucket(m, dish, self.date, rng.randint(50, 400), hot=False)
        status, _ = self.admin("init", rng, "/admin/buckets",
                               {"merchant_id": m, "dish_id": dish, "total": b.totals[0],
                                "stock_date": self.date.isoformat()})
        with self.lock:
            # Requested is enough to track it: a timed-out init may still have happened.
            self.buckets[b.bucket_id] = b
            b.open = status in (200, 202)

    def close(self, rng):
        if self.closes >= self.cfg.max_closes:
            return
        with self.lock:
            cold = [b for b in self.buckets.values() if not b.hot and b.open]
        if len(cold) < 4:
            return
        b = rng.choice(cold)
        with self.lock:
            b.open = False
            self.closes += 1
        self.admin("close", rng, f"/admin/buckets/{b.bucket_id}/close", None)

    def send_invalid(self, kind, rng):
        with self.lock:
            self.invalid_sent += 1
            n = self.invalid_sent
            known = list(self.reserved_ids[-50:])
        order_id = 90_000_000 + n
        event_id = f"chaos-{self.seed}-invalid-{n}-{kind}"
        if kind == "garbage":
            value = b"chaos: this is not Avro"
        elif kind == "unknown_schema":
            # Magic byte 0 and a schema id the registry never handed out.
            value = b"\x00" + struct.pack(">I", 2_000_000_000 + n) + b"\x02\x04chaos"
        else:
            if not known:
                value = b"\x00\x00\x00\x00"  # no reservation yet: a truncated header instead
                kind = "truncated"
            else:
                _other_order, rid = rng.choice(known)
                value = self.producer.serialize("OrderCreated", self.envelope(
                    "OrderCreated", event_id, order_id,
                    {"order_id": order_id, "merchant_id": self.cfg.merchants[0], "order_type": "INSTANT",
                     "processing_time": None, "inventory_reservation_ids": [rid]}))
        self.count(f"invalid {kind}")
        self.producer.schedule(time.monotonic(), {
            "event_id": event_id, "event_type": f"invalid:{kind}", "order_id": order_id, "value": value,
            "label": "invalid", "dup": False, "intended_dlt": kind})

    def read_loop(self):
        rng = random.Random(f"{self.seed}:reads")
        while not self.stop_event.wait(rng.uniform(0.3, 1.0)):
            with self.lock:
                pool = list(self.buckets.values())
            if not pool:
                continue
            hot = [b for b in pool if b.hot]
            b = rng.choice(hot) if hot and rng.random() < 0.7 else rng.choice(pool)
            self.count("stock read")
            self.http.call("stock_read", "reader", "GET", rng.choice(self.api_bases),
                           f"/v1/stock/{b.merchant}/{b.dish}?date={b.date.isoformat()}", None,
                           bucket=b.bucket_id)
            if self.redis_direct is not None:
                key = f"inv:{{{b.merchant}:{b.dish}:{b.date.isoformat()}}}:stock"
                try:
                    h = self.redis_direct.hgetall(key)
                except Exception as e:  # a stopped or killed Redis: no observation
                    self.history.record("redis_read", bucket=b.bucket_id, error=f"{type(e).__name__}: {e}"[:200])
                    continue
                self.history.record("redis_read", bucket=b.bucket_id, stock=h)

    # ---- run ----------------------------------------------------------------------------

    def start(self):
        for w in range(self.cfg.workers):
            self.threads.append(threading.Thread(target=self.order_worker, args=(w,), name=f"order-{w}",
                                                 daemon=True))
        self.threads.append(threading.Thread(target=self.merchant_loop, name="merchant", daemon=True))
        self.threads.append(threading.Thread(target=self.read_loop, name="reads", daemon=True))
        for t in self.threads:
            t.start()

    def stop(self, deadline_s=60.0):
        """Stop new orders; every order in flight finishes its Trys (bounded by try_deadline)."""
        self.stop_event.set()
        end = time.monotonic() + deadline_s
        for t in self.threads:
            t.join(timeout=max(0.1, end - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def bucket_plan(self):
        with self.lock:
            return {bid: {"merchant": b.merchant, "dish": b.dish, "date": b.date.isoformat(), "hot": b.hot,
                          "totals": list(b.totals), "open": b.open} for bid, b in self.buckets.items()}
