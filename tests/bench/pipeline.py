"""Part 4 and 5 of the bench: the outbox relay and the projector draining a backlog, next to
Kafka's own producer and consumer tools on records of the same count and size, and
OrderCreated -> CONFIRMED at a steady rate from an independent producer."""

import calendar
import math
import time

from confluent_kafka import Consumer, TopicPartition

from stocksvr_harness import avro, codes
from stocksvr_harness.wait import WaitTimeout, wait_until
from system import BenchError, metric_sum


def wait_counter(role, name, target, timeout, poll=0.1):
    """Polls a counter of role's /metrics until it reaches target. Returns (t_first, v_first,
    t_last, v_last): the first poll that saw it move off its start and the poll that reached
    the target, so the rate leaves out the process start and the group join."""
    seen = {"start": None, "first": None, "last": None}

    def reached():
        try:
            v = metric_sum(role.metrics(), name)
        except OSError:
            v = None
        now = time.time()
        if v is not None:
            if seen["start"] is None:
                seen["start"] = v
            if seen["first"] is None and v > seen["start"]:
                seen["first"] = (now, v)
            seen["last"] = (now, v)
            if v >= target:
                return True
        if role.proc.poll() is not None:
            raise BenchError(f"stocksvr {role.sub} exited with {role.proc.returncode} (log {role.log})")
        return False

    try:
        wait_until(reached, timeout, f"{name} of stocksvr {role.sub} to reach {target}", interval=poll)
    except WaitTimeout as e:
        last = seen["last"]
        raise BenchError(f"{name} of stocksvr {role.sub} at {last and last[1]} after {timeout}s, "
                         f"expected {target}") from e
    first, last = seen["first"] or seen["last"], seen["last"]
    return first[0], first[1], last[0], last[1]


def drain_rate(first_t, first_v, last_t, last_v):
    return (last_v - first_v) / (last_t - first_t) if last_t > first_t else None


def topic_sizes(brokers, topic, sample, group):
    """(record count from the watermarks, mean value bytes of up to sample records)."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in md.partitions]
        count = 0
        for tp in parts:
            lo, hi = c.get_watermark_offsets(tp, timeout=10)
            count += hi - lo
        c.assign(parts)
        sizes = []
        deadline = time.time() + 30
        while len(sizes) < min(sample, count) and time.time() < deadline:
            for m in c.consume(500, 1.0):
                if m.error() is None and m.value() is not None:
                    sizes.append(len(m.value()))
        return count, (sum(sizes) / len(sizes) if sizes else 0.0)
    finally:
        c.close()


def _epoch(naive_utc):
    return calendar.timegm(naive_utc.timetuple()) + naive_utc.microsecond / 1e6


def pct(values, p):
    """The nearest-rank percentile: the smallest value with at least p% of them at or below
    it. (It was round(p/100*n + 0.5), meant as a ceiling; round() goes to the even number on
    .5, so an odd rank such as p99 of 100 values took the rank above: the maximum.)"""
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(p * len(v) / 100.0 - 1e-9) - 1))]


class OrderProducer:
    """The order service: OrderCreated through the stock Confluent client and its Avro
    serializer (stocksvr_harness.avro), linger.ms 0 so the producer's own batching does not
    sit in the latency."""

    def __init__(self, brokers, registry, topic):
        self.topic = topic
        self.producer = avro.order_producer(brokers, "bench-order-service", linger_ms=0)
        self.serializers = avro.Serializers(registry, events=("OrderCreated",))
        self.failed = 0
        # When the broker acknowledged each order (acks=all), by order id: an order slow to
        # confirm is then split into the part until Kafka had it and the part after (the
        # fetch and stocksvr). The callbacks run in poll(0) after each produce, so the time
        # is late by at most the gap between two orders. Each run() starts it afresh.
        self.acked = {}

    def _delivered(self, err, msg):
        if err is not None:
            self.failed += 1
        else:
            self.acked[int(msg.key())] = time.time()

    def _value(self, order_id, rid, merchant, now):
        data = {"order_id": order_id, "merchant_id": merchant, "order_type": "INSTANT", "processing_time": None,
                "inventory_reservation_ids": [rid]}
        occurred = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}+00:00"
        return self.serializers.value("OrderCreated", avro.envelope(
            "OrderCreated", f"bench-oc-{order_id}", order_id, data, "bench-order-service", occurred_at=occurred),
            self.topic)

    def warm_up(self, merchant):
        """What a running order service has done long before: connected to the brokers, read
        the topic's metadata and registered the schema (one serialization, not produced).
        Without it the first orders' latency holds the producer's start-up (a registry round
        trip, the connection and the producer id), and the orders paced behind it go out in a
        burst."""
        self.producer.list_topics(self.topic, timeout=10)
        self._value(1, 1, merchant, time.time())
        self.producer.poll(0.5)

    def run(self, orders, merchant, rate):
        """Produces OrderCreated for each (order_id, reservation_id) at rate per second (paced
        by the clock, not by acks). Returns {order_id: produce time}."""
        sent = {}
        self.acked = {}
        t0 = time.time() + 0.2
        for k, (order_id, rid) in enumerate(orders):
            due = t0 + k / rate
            delay = due - time.time()
            if delay > 0:
                time.sleep(delay)
            now = time.time()
            value = self._value(order_id, rid, merchant, now)
            sent[order_id] = now
            self.producer.produce(self.topic, key=str(order_id).encode(), value=value,
                                  on_delivery=self._delivered)
            self.producer.poll(0)
        left = self.producer.flush(60)
        if left or self.failed:
            raise BenchError(f"the order producer lost {left + self.failed} OrderCreated")
        return sent, time.time() - t0


def confirm_latencies(db, sent, rids, timeout):
    """Waits until every reservation of sent is CONFIRMED (at most timeout seconds); returns
    (latencies produce -> CONFIRMED updated_at, projection delays CONFIRMED -> its ledger row,
    confirmed count, confirms per second from the first produce to the last confirm, and
    (produce time, latency) of every confirmed order, to find when the slow ones came)."""
    ids = list(rids.values())
    seen = {"confirmed": 0}

    def all_confirmed():
        confirmed = 0
        for i in range(0, len(ids), 5000):
            chunk = ids[i:i + 5000]
            confirmed += db.one(
                f"SELECT COUNT(*) FROM inventory_reservation WHERE status = {codes.CONFIRMED} "
                f"AND id IN ({','.join(map(str, chunk))})")
        seen["confirmed"] = confirmed
        return confirmed == len(ids)

    try:
        wait_until(all_confirmed, timeout, f"{len(ids):,} reservations to be CONFIRMED")
    except WaitTimeout:
        pass  # the figures say how many were
    confirmed = seen["confirmed"]
    lat, proj, last, timed = [], [], None, []
    for i in range(0, len(ids), 5000):
        chunk = ids[i:i + 5000]
        rows = db.q(
            "SELECT r.order_id, r.updated_at, l.created_at FROM inventory_reservation r"
            " LEFT JOIN inventory_ledger l ON l.operation_id = CONCAT('op_confirm_', r.id)"
            f" WHERE r.status = {codes.CONFIRMED} AND r.id IN ({','.join(map(str, chunk))})")
        for order_id, updated, booked in rows:
            lat.append(_epoch(updated) - sent[int(order_id)])
            timed.append((sent[int(order_id)], lat[-1]))
            last = max(last or 0.0, _epoch(updated))
            if booked is not None:
                proj.append(_epoch(booked) - _epoch(updated))
    # Confirms per second from the first produce to the last CONFIRMED row.
    rate = confirmed / (last - min(sent.values())) if last and sent and last > min(sent.values()) else None
    return lat, proj, confirmed, rate, timed


def slow_seconds(timed, slow, top=5):
    """The seconds of the run (from the first produce) holding the most orders slower than
    `slow` seconds: [(second, orders that second, slow ones, max latency)], worst first."""
    if not timed:
        return []
    t0 = min(t for t, _ in timed)
    by = {}
    for t, lat in timed:
        n, k, mx = by.get(int(t - t0), (0, 0, 0.0))
        by[int(t - t0)] = (n + 1, k + (lat > slow), max(mx, lat))
    worst = sorted(by.items(), key=lambda e: (-e[1][1], -e[1][2]))[:top]
    return [(sec, n, k, mx) for sec, (n, k, mx) in worst if k]


def _bucket_increase(before, after, name, match=None):
    """[(upper bound, cumulative count)] of a Prometheus histogram's increase between two
    scrapes, summed over its label sets (those with every label of `match`), ascending
    (+Inf last)."""
    def buckets(m):
        out = {}
        for (n, labels), v in m.items():
            labels = dict(labels)
            if n == name + "_bucket" and all(labels.get(k) == w for k, w in (match or {}).items()):
                le = labels.get("le")
                key = float("inf") if le == "+Inf" else float(le)
                out[key] = out.get(key, 0.0) + v
        return out
    b0, b1 = buckets(before), buckets(after)
    return sorted((le, b1[le] - b0.get(le, 0.0)) for le in b1)


def histogram_quantile(before, after, name, q, match=None):
    """histogram_quantile over the increase of a Prometheus histogram between two scrapes
    (linear inside the bucket, as Prometheus does), over the label sets with every label of
    `match`. Returns (value in seconds, count)."""
    inc = _bucket_increase(before, after, name, match)
    if not inc or inc[-1][1] <= 0:
        return None, 0
    total = inc[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in inc:
        if c >= rank:
            if le == float("inf"):
                return prev_le, total
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-9), total
        prev_le, prev_c = le, c
    return inc[-1][0], total


def histogram_share_over(before, after, name, bound):
    """Share of a histogram's observations between two scrapes that were over `bound`, which
    must be one of its bucket bounds: exact, where a quantile is interpolated inside a
    bucket. None when nothing was observed or `bound` is not a bound."""
    inc = dict(_bucket_increase(before, after, name))
    total = inc.get(float("inf"), 0.0)
    if total <= 0 or bound not in inc:
        return None
    return 1.0 - inc[bound] / total


# The parts of a commit group's transaction, the `part` label of
# stocksvr_try_group_part_seconds: the connection and BEGIN, the CAS UPDATE, the outbox
# INSERT, the COMMIT with its log flush.
GROUP_PARTS = ("open", "cas", "outbox", "commit")


def histogram_mean(before, after, name, match=None):
    """(count, mean) of a Prometheus histogram's observations between two scrapes, from its
    _sum and _count, over the label sets with every label of `match`; (0, None) when none."""
    def total(m, series):
        return sum(v for (n, labels), v in m.items() if n == series
                   and all(dict(labels).get(k) == w for k, w in (match or {}).items()))
    n = total(after, name + "_count") - total(before, name + "_count")
    if n <= 0:
        return 0, None
    return n, (total(after, name + "_sum") - total(before, name + "_sum")) / n
