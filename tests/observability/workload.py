#!/usr/bin/env python3
"""The demo workload of the live dashboard check (tests/observability/live.sh), as an order
service would drive stocksvr: Trys through the HTTP API, order events through Kafka with the
stock Confluent producer and AvroSerializer (TopicRecordNameStrategy, as tests/interop/).

    workload.py healthy --seconds 30 ...   the mix below, then one of each rare case
    workload.py outage --seconds 60 ...    OrderCreated of the orders `healthy` held back,
                                           while stocksvr is down (lag grows at the broker)
    workload.py cleanup --namespace NS     deletes the run's topics and consumer groups

Healthy mix, one order per step (about 8 steps a second): instant Try then OrderCreated
(confirm), OrderCreatedFailed (cancel), OrderCanceled after OrderCreated (refund), a partial
RefundRequested after OrderCreated, a Try the small bucket rejects, and every seventh order
held back without an event (`--held` file, for the outage phase); every 40th step a rush of
16 concurrent Trys, each confirmed (so the API forms commit groups of more than one row). Once each: a scheduled order
due a few seconds later (the time wheel confirms it), an OrderCreated after an
OrderCreatedFailed (a conflict), a RefundRequested before its OrderCreated (deferred, then
applied), a record that is not Avro (dead-lettered, parked, then replayed by the operator API),
a dead letter of another deployment's group on our dead-letter topic (left alone), and bad
Try requests (400, 404).

Prints a summary line; exits 1 when fewer than half of the Trys were answered 2xx or an event
was not acknowledged, since the query check would then test nothing.
Runs in the harnesses' environment (tests/venv.sh: confluent-kafka[avro], requests).
"""

import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from stocksvr_harness import avro, kafka
from stocksvr_harness.wait import WaitTimeout, wait_until

rfc3339 = avro.rfc3339


class Orders:
    """The order service's side: its Kafka producer and the HTTP client of the Try API."""

    def __init__(self, args):
        self.args = args
        self.api = args.api.rstrip("/")
        self.http = requests.Session()
        self.topic = f"{args.namespace}.order.lifecycle.v1" if args.namespace else "order.lifecycle.v1"
        self.producer = avro.order_producer(args.bootstrap, "obs-live-order-service", linger_ms=5)
        self.serializers = avro.Serializers(args.registry)
        self.counts = {}
        self.counts_lock = threading.Lock()  # a rush counts from its threads
        self.failed_acks = 0
        self.seq = 0

    def count(self, what):
        with self.counts_lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def _acked(self, err, _msg):
        if err is not None:
            self.failed_acks += 1
            print(f"workload: event not acknowledged: {err}", file=sys.stderr)

    def event(self, kind, order_id, data):
        self.seq += 1
        envelope = avro.envelope(kind, f"{self.args.run_id}-{kind}-{order_id}-{self.seq}", order_id,
                                 dict(data, order_id=order_id, merchant_id=self.args.merchant),
                                 "obs-live-order-service")
        value = self.serializers.value(kind, envelope, self.topic)
        self.producer.produce(self.topic, key=str(order_id).encode(), value=value,
                              on_delivery=self._acked)
        self.producer.poll(0)
        self.count(f"event {kind}")

    def raw(self, topic, value, headers=None, key=b"obs-live"):
        self.producer.produce(topic, key=key, value=value, headers=headers or [],
                              on_delivery=self._acked)
        self.producer.poll(0)

    def try_(self, order_id, dish=None, quantity=1, scheduled_at=None, http=None):
        """One Try; the reservation id, or None when it was not reserved. `http` is the
        client to send it with (a rush's threads each bring their own)."""
        body = {
            "order_id": order_id, "order_item_id": order_id * 10 + 1,
            "merchant_id": self.args.merchant, "dish_id": dish or self.args.dish,
            "quantity": quantity,
            "order_type": "SCHEDULED" if scheduled_at else "INSTANT",
        }
        if scheduled_at:
            body["processing_time"] = rfc3339(scheduled_at)
        try:
            reply = (http or self.http).post(f"{self.api}/v1/reservations", json=body, timeout=10)
        except requests.RequestException as e:
            self.count(f"try error {type(e).__name__}")
            return None
        self.count(f"try {reply.status_code}")
        if reply.status_code not in (200, 201):
            return None
        reservation = reply.json()["reservation"]
        return int(reservation["reservation_id"]) if reservation["status"] == "RESERVED" else None

    def flush(self, seconds=30):
        left = self.producer.flush(seconds)
        if left:
            self.failed_acks += left
            print(f"workload: {left} events still unacknowledged after {seconds} s", file=sys.stderr)


def created(o, order, rid, scheduled_at=None):
    o.event("OrderCreated", order, {
        "order_type": "SCHEDULED" if scheduled_at else "INSTANT",
        "processing_time": rfc3339(scheduled_at) if scheduled_at else None,
        "inventory_reservation_ids": [rid]})


def failed(o, order, rid):
    o.event("OrderCreatedFailed", order, {"inventory_reservation_ids": [rid],
                                          "reason": "payment failed"})


RUSH_TRYS = 16


def rush(o, first_order):
    """A lunch rush on the big dish: RUSH_TRYS concurrent Trys, each then confirmed. The
    steady mix sends one request at a time, so the API's commit groups would hold one row
    each and the group panels (group size, `stocksvr_try_group_part_seconds`, which is
    recorded only for groups of two or more) would show nothing."""
    orders = range(first_order, first_order + RUSH_TRYS)
    with ThreadPoolExecutor(RUSH_TRYS) as pool:
        rids = list(pool.map(lambda order: o.try_(order, http=requests), orders))
    o.count("rush")
    for order, rid in zip(orders, rids, strict=True):
        if rid:
            created(o, order, rid)


def rare_cases(o, base):
    """One of each case a short healthy run would otherwise never show."""
    # A scheduled order due in 4 s: RESERVED, CREATED_RESERVED on OrderCreated, then the time
    # wheel emits InventoryConfirmDue and the schedule processor confirms it.
    due = datetime.now(timezone.utc) + timedelta(seconds=4)
    rid = o.try_(base + 1, scheduled_at=due)
    if rid:
        created(o, base + 1, rid, scheduled_at=due)
    # OrderCreated after OrderCreatedFailed: reported as a conflict, not retried.
    rid = o.try_(base + 2)
    if rid:
        failed(o, base + 2, rid)
        created(o, base + 2, rid)
    # RefundRequested before its OrderCreated: deferred until the OrderCreated applies.
    rid = o.try_(base + 3, quantity=2)
    if rid:
        o.event("RefundRequested", base + 3, {
            "refund_id": f"{o.args.run_id}-early-{base + 3}",
            "items": [{"inventory_reservation_id": rid, "quantity": 1}], "reason": None})
        o.flush()
        time.sleep(1.5)
        created(o, base + 3, rid)
    # Not Avro at all: dead-lettered as undecodable, then parked by the dead-letter processor.
    o.raw(o.topic, b"not avro at all", key=str(base + 4).encode())
    # A dead letter another deployment's group wrote to our dead-letter topic: left alone.
    o.raw(f"{o.topic}.dlt", b"someone else's", headers=[
        ("stocksvr.dlt.consumer-group", b"another-deployment.order-lifecycle"),
        ("stocksvr.dlt.original-topic", o.topic.encode()),
        ("stocksvr.dlt.error-class", b"invalid")])
    # Bad requests: a 400 naming the field, a 404 for a dish without a bucket.
    r = o.http.post(f"{o.api}/v1/reservations", json={"order_id": base + 5}, timeout=10)
    o.count(f"bad try {r.status_code}")
    o.try_(base + 6, dish=o.args.dish + 999_999)
    o.flush()


def replay_parked(o, within=30):
    """Replays the parked dead letter through the operator API once it is parked."""
    def parked():
        r = o.http.get(f"{o.api}/admin/dlq", params={"limit": 10}, timeout=10)
        return r.json().get("dead_letters", []) if r.ok else []

    try:
        letters = wait_until(parked, within, "a parked dead letter")
    except WaitTimeout:
        o.count("dlq replay: nothing parked in time")
        return
    r = o.http.post(f"{o.api}/admin/dlq/{letters[0]['id']}/replay", timeout=10)
    o.count(f"dlq replay {r.status_code}")


def healthy(o, seconds, held_file):
    base = int(time.time() * 1000) * 10
    rare_cases(o, base)
    held = []
    order = base + 100
    step = 0
    deadline = time.monotonic() + seconds
    replayed = False
    while time.monotonic() < deadline:
        started = time.monotonic()
        step += 1
        order += 1
        kind = step % 6
        if kind == 5:
            o.try_(order, dish=o.args.small_dish)  # reserved once, then REJECTED
        else:
            rid = o.try_(order, quantity=2 if kind == 3 else 1)
            if rid and step % 7 == 0:  # 7: every kind of step is held back in turn
                held.append((order, rid))
            elif rid and kind == 2:
                failed(o, order, rid)
            elif rid:
                created(o, order, rid)
                if kind == 3:
                    o.event("RefundRequested", order, {
                        "refund_id": f"{o.args.run_id}-{order}",
                        "items": [{"inventory_reservation_id": rid, "quantity": 1}],
                        "reason": "one dish missing"})
                elif kind == 4:
                    o.event("OrderCanceled", order, {"inventory_reservation_ids": [rid],
                                                     "reason": "customer canceled"})
        if step % 40 == 1:  # about every 5 s, so every 1-minute rate window holds rushes
            rush(o, base + 1_000_000 + step * RUSH_TRYS)
        if not replayed and step % 20 == 0:
            replay_parked(o, within=0.1)  # a look, no wait: the loop goes on
            replayed = "dlq replay 200" in o.counts
        o.producer.poll(0)
        time.sleep(max(0.0, 0.12 - (time.monotonic() - started)))
    if not replayed:
        replay_parked(o, within=20)
    o.flush()
    if held_file:
        with open(held_file, "w") as f:
            json.dump(held, f)


def outage(o, seconds, held_file):
    with open(held_file) as f:
        held = json.load(f)
    deadline = time.monotonic() + seconds
    for order, rid in held:
        if time.monotonic() >= deadline:
            break
        created(o, order, rid)
        time.sleep(0.5)
    o.flush()
    time.sleep(max(0.0, deadline - time.monotonic()))


def cleanup(bootstrap, namespace):
    """Deletes the topics `<namespace>.*` and the consumer groups `<namespace>.*`."""
    if not namespace:
        raise SystemExit("cleanup: --namespace is required (it never deletes shared topics)")
    topics = kafka.delete_topics(bootstrap, f"{namespace}.")
    groups = kafka.delete_groups(bootstrap, f"{namespace}.")
    print(f"cleanup: deleted {len(topics)} topics and {len(groups)} consumer groups of {namespace}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=("healthy", "outage", "cleanup"))
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--api")
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--registry", default="http://127.0.0.1:8081/apis/ccompat/v7")
    ap.add_argument("--namespace", default="", help="kafka.topic_namespace of the run")
    ap.add_argument("--run-id", help="prefix of event ids")
    ap.add_argument("--merchant", type=int)
    ap.add_argument("--dish", type=int, help="a dish with a large bucket")
    ap.add_argument("--small-dish", type=int, help="a dish whose bucket holds 1")
    ap.add_argument("--held", help="file of orders held back (written by healthy, read by outage)")
    args = ap.parse_args()
    if args.phase == "cleanup":
        return cleanup(args.bootstrap, args.namespace)
    missing = [f"--{k.replace('_', '-')}" for k in ("api", "run_id", "merchant", "dish", "small_dish")
               if getattr(args, k) is None]
    if missing:
        ap.error(f"{args.phase} needs {', '.join(missing)}")

    o = Orders(args)
    started = time.monotonic()
    if args.phase == "healthy":
        healthy(o, args.seconds, args.held)
    else:
        outage(o, args.seconds, args.held)
    tries = sum(n for k, n in o.counts.items() if k.startswith("try "))
    ok = sum(n for k, n in o.counts.items() if k in ("try 200", "try 201"))
    summary = ", ".join(f"{k}: {n}" for k, n in sorted(o.counts.items()))
    print(f"workload {args.phase}: {time.monotonic() - started:.0f} s; {summary}; "
          f"unacknowledged events: {o.failed_acks}")
    if args.phase == "healthy" and (tries == 0 or ok * 2 < tries):
        print(f"workload: only {ok} of {tries} Trys answered 2xx", file=sys.stderr)
        return 1
    return 1 if o.failed_acks else 0


if __name__ == "__main__":
    sys.exit(main())
