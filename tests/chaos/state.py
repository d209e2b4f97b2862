"""Reading the final state: MySQL rows, Redis keys, Kafka consumer lag; waiting for quiescence;
dumps for the replay comparison.
"""

import json
import time

import pymysql
import pymysql.cursors
import redis as redis_lib
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from stocksvr_harness import codes
from stocksvr_harness.secure import PlainClients
from stocksvr_harness.wait import WaitTimeout, wait_until

STATUS = codes.RESERVATION_STATUS
TERMINAL = ("CONFIRMED", "CANCELED", "REJECTED", "REFUNDED")
HOLDING = tuple(STATUS[c] for c in codes.HOLDING)
LEDGER_ACTION = codes.LEDGER_ACTION
WAL_ACTION = codes.WAL_ACTION
WAL_STATUS = codes.WAL_STATUS
OUTBOX_UNSENT = codes.OUTBOX_UNSENT
OUTBOX_SENT_WHERE = codes.OUTBOX_SENT

# The consumer group of each processor and the topics it reads (dead-letter: every *.dlt).
GROUP_TOPICS = {
    "stocksvr.order-lifecycle": ["order.lifecycle.v1"],
    "stocksvr.projector": ["inventory.stock-change.v1"],
    "stocksvr.schedule": ["inventory.schedule.v1"],
    "stocksvr.dead-letter": ["order.lifecycle.v1.dlt", "inventory.schedule.v1.dlt", "inventory.stock-change.v1.dlt"],
}


class State:
    def __init__(self, mysql_port, redis_port, kafka_bootstrap, clients=None):
        # clients: the stack's client settings (stocksvr_harness.secure; None: a plaintext stack).
        self.clients = clients or PlainClients()
        self.mysql_args = dict(host="127.0.0.1", port=mysql_port, database="stocksvr", autocommit=True,
                               connect_timeout=5, read_timeout=60, write_timeout=60,
                               cursorclass=pymysql.cursors.DictCursor, **self.clients.mysql())
        self.redis = redis_lib.Redis(host="127.0.0.1", port=redis_port, decode_responses=True,
                                     socket_timeout=10, socket_connect_timeout=5, **self.clients.redis())
        self.kafka_bootstrap = kafka_bootstrap
        self._admin = None
        self._consumer = None
        # A Kafka cluster run (issue 14) uses new Kafka clients for every probe: the Python
        # client (confluent-kafka 2.16.1) crashed twice (segfault in librdkafka's rdk:main
        # thread) and once kept a topic's partitions unknown for minutes, each time in a
        # long-lived client after kill -9 of the broker it had bootstrapped from.
        self.fresh_kafka_clients = False

    # ---- MySQL --------------------------------------------------------------------------

    def query(self, sql, args=None):
        conn = pymysql.connect(**self.mysql_args)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return list(cur.fetchall())
        finally:
            conn.close()

    def tables(self):
        return [next(iter(r.values())) for r in self.query("SHOW TABLES")]

    # ---- Kafka --------------------------------------------------------------------------

    def admin(self):
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.kafka_bootstrap, **self.clients.kafka()})
        return self._admin

    def consumer(self):
        if self._consumer is None:
            self._consumer = Consumer({"bootstrap.servers": self.kafka_bootstrap, "group.id": "chaos-checker",
                                       **self.clients.kafka(),
                                       "enable.auto.commit": False})
        return self._consumer

    def partitions(self, topic):
        md = self.admin().list_topics(topic=topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return []
        return sorted(t.partitions)

    def watermarks(self, topic):
        out = {}
        for p in self.partitions(topic):
            out[p] = self.consumer().get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        return out

    def committed(self, group):
        fut = self.admin().list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
        res = fut[group].result(timeout=15)
        return {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions or []}

    def lag(self):
        """group -> {"topic:partition": records not yet committed} (only partitions with lag)."""
        out = {}
        for group, topics in GROUP_TOPICS.items():
            committed = self.committed(group)
            lags = {}
            for topic in topics:
                for p, (low, high) in self.watermarks(topic).items():
                    c = committed.get((topic, p), -1001)
                    start = c if c >= 0 else low
                    if high - start > 0:
                        lags[f"{topic}:{p}"] = high - start
            if lags:
                out[group] = lags
        return out

    def topic_records(self, topic):
        return sum(high - low for low, high in self.watermarks(topic).values())

    # ---- quiescence ---------------------------------------------------------------------

    def pending(self, hold_ttl_grace=45):
        """What keeps the system from being quiescent (empty dict = quiescent)."""
        if self.fresh_kafka_clients:
            self.reset_kafka_clients()
        p = {}
        rows = self.query("SELECT o.status, COUNT(*) n FROM inventory_outbox o "
                          "JOIN inventory_outbox_relay c ON c.id = 1 "
                          f"WHERE {OUTBOX_UNSENT} GROUP BY o.status")
        if rows:
            p["outbox"] = {str(r["status"]): r["n"] for r in rows}
        rows = self.query("SELECT status, COUNT(*) n FROM inventory_reservation WHERE status IN "
                          f"{codes.sql_list(codes.INTERMEDIATE)} AND dead = 0 GROUP BY status")
        if rows:
            p["intermediate_reservations"] = {STATUS[r["status"]]: r["n"] for r in rows}
        rows = self.query("SELECT status, COUNT(*) n FROM inventory_operation_wal WHERE status IN "
                          f"{codes.sql_list(codes.WAL_UNFINISHED)} GROUP BY status")
        if rows:
            p["wal"] = {WAL_STATUS[r["status"]]: r["n"] for r in rows}
        # Scheduled confirms due (the wheel or the 30 s scan must have confirmed them).
        rows = self.query("SELECT COUNT(*) n FROM inventory_reservation WHERE status = %s AND dead = 0 "
                          "AND processing_time < UTC_TIMESTAMP(3) - INTERVAL 60 SECOND", (codes.CREATED_RESERVED,))
        if rows and rows[0]["n"]:
            p["scheduled_overdue"] = rows[0]["n"]
        # Scheduled confirms not due yet: their outcome is part of the check, so wait for them.
        rows = self.query("SELECT COUNT(*) n FROM inventory_reservation WHERE status = %s AND dead = 0 "
                          "AND processing_time >= UTC_TIMESTAMP(3) - INTERVAL 60 SECOND", (codes.CREATED_RESERVED,))
        if rows and rows[0]["n"]:
            p["scheduled_not_due"] = rows[0]["n"]
        # RESERVED rows the stale watcher (every 30 s) should have alerted by now.
        rows = self.query("SELECT COUNT(*) n FROM inventory_reservation WHERE status = %s AND dead = 0 "
                          "AND stale_alerted_at IS NULL AND expire_at < UTC_TIMESTAMP(3) - INTERVAL %s SECOND",
                          (codes.RESERVED, hold_ttl_grace))
        if rows and rows[0]["n"]:
            p["stale_not_alerted"] = rows[0]["n"]
        rows = self.query("SELECT COUNT(*) n, TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(3), MAX(expire_at)) s "
                          "FROM inventory_reservation WHERE status = %s AND dead = 0 AND stale_alerted_at IS NULL",
                          (codes.RESERVED,))
        if rows and rows[0]["n"]:
            p["reserved_not_yet_stale"] = {"rows": rows[0]["n"], "latest_expiry_in_s": rows[0]["s"]}
        # A parked order event (it came before what it waits for) is consumed, so the lag does
        # not show it: its effect is still to come, from the re-driver.
        rows = self.query("SELECT COUNT(*) n FROM inventory_deferred_event WHERE status = %s",
                          (codes.DEFERRED_PARKED,))
        if rows and rows[0]["n"]:
            p["parked_order_events"] = rows[0]["n"]
        # A suspected difference gets its second look `reconcile.settle_ms` after the pass that
        # raised it: cleared (one born of lag) or confirmed (a real one, which the
        # stores_agree check finds in its own numbers).
        rows = self.query("SELECT COUNT(*) n FROM inventory_reconcile_difference WHERE status = %s",
                          (codes.DIFFERENCE_SUSPECTED,))
        if rows and rows[0]["n"]:
            p["reconcile_suspected"] = rows[0]["n"]
        lag = self.lag()
        if lag:
            p["consumer_lag"] = lag
        return p

    def wait_quiescent(self, deadline_s, stable_s=3.0, tick=1.0, on_tick=None, hold_ttl_grace=45):
        """Poll until nothing is pending for stable_s. Returns (ok, seconds, last pending)."""
        t0 = time.monotonic()
        seen = {"last": None, "quiet_since": None}

        def quiet_long_enough():
            try:
                last = self.pending(hold_ttl_grace)
            except (pymysql.MySQLError, KafkaException, OSError) as e:
                last = {"error": f"{type(e).__name__}: {e}"}
                if isinstance(e, KafkaException):
                    # Seen once after kill -9 of a cluster's first bootstrap broker: this client's
                    # metadata kept a topic without partitions ("Local: Unknown partition") for
                    # minutes while the cluster and every group were healthy. Fresh clients.
                    self.reset_kafka_clients()
            seen["last"] = last
            now = time.monotonic()
            seen["quiet_since"] = None if last else (seen["quiet_since"] or now)
            if seen["quiet_since"] is not None and now - seen["quiet_since"] >= stable_s:
                return True
            if on_tick:
                on_tick(last)
            return False

        try:
            wait_until(quiet_long_enough, deadline_s, "quiescence", interval=tick)
        except WaitTimeout:
            return False, round(time.monotonic() - t0, 1), seen["last"]
        return True, round(time.monotonic() - t0, 1), {}

    # ---- Redis --------------------------------------------------------------------------

    def redis_keys(self, pattern="*"):
        return sorted(self.redis.scan_iter(match=pattern, count=1000))

    def redis_dump(self):
        """key -> (type, value) for every key; hashes as dicts, sorted sets as [member, score]."""
        out = {}
        for k in self.redis_keys():
            t = self.redis.type(k)
            if t == "hash":
                v = self.redis.hgetall(k)
            elif t == "string":
                v = self.redis.get(k)
            elif t == "zset":
                v = [[m, s] for m, s in self.redis.zrange(k, 0, -1, withscores=True)]
            elif t == "set":
                v = sorted(self.redis.smembers(k))
            elif t == "list":
                v = self.redis.lrange(k, 0, -1)
            else:
                v = None
            out[k] = (t, v)
        return out

    def reset_kafka_clients(self):
        self.close()
        self._admin = None

    def close(self):
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def jsonable(v):
    if isinstance(v, (bytes, bytearray)):
        try:
            return v.decode()
        except UnicodeDecodeError:
            return "0x" + v.hex()
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if v is not None and not isinstance(v, (int, float, str, bool, list, dict)):
        return str(v)
    return v


def row(r):
    return {k: jsonable(v) for k, v in r.items()}


def dumps(v):
    return json.dumps(v, sort_keys=True, default=str)
