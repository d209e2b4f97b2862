"""The order-event producer of the workload (workload.EventProducer): events go out in due
order, finish() hands over what is left and waits for the acks, and only the producer's own
thread ever calls into the Kafka client (two threads serving librdkafka's callbacks at once
crashed a CI run with exit 139)."""

import threading
import time

from workload import EventProducer


class FakeHistory:
    def __init__(self):
        self.records = []
        self._lock = threading.Lock()

    def record(self, kind, **fields):
        with self._lock:
            self.records.append((kind, fields))


class FakeMessage:
    def __init__(self, topic, offset):
        self._topic, self._offset = topic, offset

    def topic(self):
        return self._topic

    def partition(self):
        return 0

    def offset(self):
        return self._offset


class FakeProducer:
    """Acknowledges on poll/flush, as librdkafka serves delivery callbacks, and notes which
    thread made each call."""

    def __init__(self, unacked_at_flush=0):
        self.callers = []
        self.produced = []
        self._pending = []
        self.unacked_at_flush = unacked_at_flush

    def _serve(self):
        while self._pending:
            _, cb = self._pending.pop(0)
            cb(None, FakeMessage("order.lifecycle.v1", len(self.produced)))

    def produce(self, topic, key, value, on_delivery):
        self.callers.append(threading.current_thread().name)
        self.produced.append(value)
        self._pending.append((value, on_delivery))

    def poll(self, timeout):
        self.callers.append(threading.current_thread().name)
        self._serve()
        return 0

    def flush(self, timeout):
        self.callers.append(threading.current_thread().name)
        if self.unacked_at_flush:
            return self.unacked_at_flush
        self._serve()
        return 0


def event(n):
    return {"event_id": f"e{n}", "event_type": "OrderCreated", "order_id": n, "value": f"v{n}".encode()}


def producer(fake):
    return EventProducer(FakeHistory(), "unused:9092", "http://unused", producer=fake)


def test_finish_sends_what_is_scheduled_in_due_order_and_only_the_producer_thread_calls_the_client():
    fake = FakeProducer()
    p = producer(fake)
    p.start()
    now = time.monotonic()
    # Scheduled out of order, one far in the future: finish() sends it anyway, after the others.
    p.schedule(now + 3600, event(3))
    p.schedule(now, event(1))
    p.schedule(now + 0.01, event(2))
    assert p.finish(5) == 0
    assert fake.produced == [b"v1", b"v2", b"v3"]
    assert p.acked == 3 and p.failed == 0
    assert fake.callers and set(fake.callers) == {"producer"}, fake.callers
    assert not p._thread.is_alive()


def test_finish_counts_what_the_flush_left_unacknowledged():
    fake = FakeProducer(unacked_at_flush=2)
    p = producer(fake)
    p.start()
    p.schedule(time.monotonic(), event(1))
    p.schedule(time.monotonic(), event(2))
    assert p.finish(5) == 2
    assert set(fake.callers) == {"producer"}
