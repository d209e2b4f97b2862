"""Kafka housekeeping of the harnesses: topics made for a run, the topics and consumer groups
of a run's namespace deleted at its end, and a group's lag."""

import sys

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def create_topic(bootstrap, name, partitions=3, replication=1, exist_ok=False):
    """Creates one topic; with `exist_ok`, one that exists already (another creator won the
    race) is fine. Returns whether this call created it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if exist_ok and name in admin.list_topics(timeout=10).topics:
        return False
    future = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=replication)],
                                 operation_timeout=30)[name]
    try:
        future.result(60)
    except Exception as e:  # confluent_kafka raises KafkaException wrapping the broker's error
        if exist_ok and "TOPIC_ALREADY_EXISTS" in str(e):
            return False
        raise
    return True


def _report(what, errors):
    for name, e in errors:
        print(f"kafka: deleting {what} {name}: {e}", file=sys.stderr)


def delete_topics(bootstrap, prefix):
    """Deletes every topic whose name starts with `prefix` (a run's namespace, never empty):
    the names it asked to delete. A topic that is gone already is fine; other errors are
    printed and the rest still goes."""
    if not prefix:
        raise ValueError("delete_topics needs a prefix (it never deletes shared topics)")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    errors = []
    for name, f in (admin.delete_topics(names, operation_timeout=30).items() if names else []):
        try:
            f.result(60)
        except Exception as e:  # KafkaException; UNKNOWN_TOPIC_OR_PART means gone already
            if "UNKNOWN_TOPIC" not in str(e):
                errors.append((name, e))
    _report("topic", errors)
    return names


def delete_groups(bootstrap, prefix):
    """Deletes every consumer group whose id starts with `prefix`; the ids it asked to delete."""
    if not prefix:
        raise ValueError("delete_groups needs a prefix (it never deletes shared groups)")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    groups = [g.group_id for g in admin.list_consumer_groups(request_timeout=10).result(30).valid
              if g.group_id.startswith(prefix)]
    errors = []
    for name, f in (admin.delete_consumer_groups(groups, request_timeout=30).items() if groups else []):
        try:
            f.result(60)
        except Exception as e:  # KafkaException; a group still with members stays (reported)
            errors.append((name, e))
    _report("group", errors)
    return groups


def group_lag(bootstrap, group, topic):
    """Records of `topic` the consumer group has not committed yet (None: unknown)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        parts = [TopicPartition(topic, p) for p in md.partitions]
        lag = 0
        for tp in c.committed(parts, timeout=10):
            _lo, hi = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
            lag += hi - (tp.offset if tp.offset >= 0 else 0)
        return lag
    except Exception:  # any client error: the caller polls again (None is "not known yet")
        return None
    finally:
        c.close()
