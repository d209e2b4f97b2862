"""Replay from the earliest offset changes nothing (issue 9.5).

With every role stopped: dump every table and every Redis key (A); reset every consumer group to
the earliest offset of each of its topics with `stocksvr offsets reset ... --to-earliest
--execute`; run the roles again until quiescent; stop them; dump again (B); every difference
between A and B is an anomaly `replay` naming the table and row key (or the Redis key).

Left out of the comparison because they record when something was processed, not what
(EXCLUDED_COLUMNS, EXCLUDED_TABLES, EXCLUDED_HASH_FIELDS):
"""

from state import GROUP_TOPICS, dumps, row
from stocksvr_harness import codes

EXCLUDED_COLUMNS = {
    "created_at", "updated_at",        # every table: row written / last changed
    "next_retry_at",                   # reservation, WAL, outbox: next attempt of a worker
    "sent_at",                         # outbox: broker ack time
    "consumed_at",                     # inbox: when the projector booked the event
    "lease_owner", "lease_expire_at",  # WAL: which process held the row, until when
    "stale_alerted_at",                # reservation: when the stale watcher alerted
    "full_checked_at",                 # baseline: the reconciler's last clean full check
}
EXCLUDED_TABLES = {
    "snowflake_worker_lease",  # each process start leases a worker id: processes, not data
    "_sqlx_migrations",        # installed_on / execution_time of the migrations
    "inventory_reconcile_shard",  # reconciler shard leases: which process checks what, until when
    "inventory_outbox_relay",     # the relay's leader lease (owner, epoch, until when) and mark
}
EXCLUDED_HASH_FIELDS = {"updated_at", "operated_at"}  # Redis: stock hash and fence / op record
# The time wheel (`inv:{schedule:<ns>:<n>}:due`) is compared for parked reservations only
# (CREATED_RESERVED): an entry of one that left the wheel's care (refunded, canceled) is a
# timer the poller drops when it fires, or the schedule scan when a role starts, so whether the
# replay's restart dropped it early says nothing about the replay (a fault run found one).
PARKED = codes.CREATED_RESERVED

__doc__ += "\n".join([
    "  columns: " + ", ".join(sorted(EXCLUDED_COLUMNS)),
    "  tables: " + ", ".join(sorted(EXCLUDED_TABLES)),
    "  Redis hash fields: " + ", ".join(sorted(EXCLUDED_HASH_FIELDS)) + " (and key TTLs)",
    "  time wheel entries of reservations not parked (CREATED_RESERVED)",
])


def primary_key(state, table):
    cols = [r["Column_name"] for r in state.query(f"SHOW KEYS FROM `{table}` WHERE Key_name = 'PRIMARY'")]
    return cols


def dump(state):
    out = {"tables": {}, "redis": {}}
    for table in state.tables():
        if table in EXCLUDED_TABLES:
            continue
        pk = primary_key(state, table)
        rows = {}
        for r in state.query(f"SELECT * FROM `{table}`"):
            r = row(r)
            key = dumps([r.get(c) for c in pk]) if pk else dumps(r)
            rows[key] = {k: v for k, v in r.items() if k not in EXCLUDED_COLUMNS}
        out["tables"][table] = rows
    parked = {str(r["id"]) for r in out["tables"].get("inventory_reservation", {}).values()
              if str(r.get("status")) == str(PARKED)}
    for k, (t, v) in state.redis_dump().items():
        if t == "hash":
            v = {f: x for f, x in v.items() if f not in EXCLUDED_HASH_FIELDS}
        if t == "zset" and k.startswith("inv:{schedule:") and k.endswith("}:due"):
            v = [entry for entry in v if str(entry[0]) in parked]
            if not v:
                continue
        out["redis"][k] = [t, v]
    return out


def natural(table, r):
    """The ids worth naming for a row of `table`."""
    keys = ("id", "reservation_id", "order_id", "operation_id", "event_id", "event_type", "stock_bucket_id",
            "dlt_topic", "dlt_offset", "original_topic", "original_partition", "original_offset", "consumer_group",
            "refund_key", "status", "error_class")
    return {k: r[k] for k in keys if k in r and r[k] is not None}


def diff(a, b, limit=30, counts=None):
    """[(check, ids, detail)] for the differences between two dumps: one summary line per table
    (and for Redis), then up to `limit` rows of each kind. `counts` (a dict) receives the
    number of rows/keys that differ per check."""
    out = []
    counts = {} if counts is None else counts
    for table in sorted(set(a["tables"]) | set(b["tables"])):
        ra, rb = a["tables"].get(table, {}), b["tables"].get(table, {})
        added = [k for k in rb if k not in ra]
        removed = [k for k in ra if k not in rb]
        changed = [k for k in ra if k in rb and ra[k] != rb[k]]
        if not (added or removed or changed):
            continue
        check = f"replay.{table}"
        counts[check] = len(added) + len(removed) + len(changed)
        out.append((check, {"table": table},
                    f"{len(added)} rows added, {len(removed)} removed, {len(changed)} changed by the replay"))
        for k in added[:limit]:
            r = rb[k]
            detail = {kk: v for kk, v in r.items() if kk in ("payload", "error_message")}
            out.append((check, dict(natural(table, r), table=table, change="added"),
                        str(detail)[:400] if detail else "new row"))
        for k in removed[:limit]:
            out.append((check, dict(natural(table, ra[k]), table=table, change="removed"), "row gone"))
        for k in changed[:limit]:
            cols = {c: (ra[k].get(c), rb[k].get(c)) for c in set(ra[k]) | set(rb[k]) if ra[k].get(c) != rb[k].get(c)}
            out.append((check, dict(natural(table, ra[k]), table=table, change="changed"),
                        "; ".join(f"{c}: {x!r} -> {y!r}" for c, (x, y) in sorted(cols.items()))[:400]))
    ka, kb = a["redis"], b["redis"]
    added = [k for k in kb if k not in ka]
    removed = [k for k in ka if k not in kb]
    changed = [k for k in ka if k in kb and ka[k] != kb[k]]
    if added or removed or changed:
        counts["replay.redis"] = len(added) + len(removed) + len(changed)
        out.append(("replay.redis", {"redis": "keys"},
                    f"{len(added)} keys added, {len(removed)} removed, {len(changed)} changed by the replay"))
        for k in added[:limit]:
            out.append(("replay.redis", {"redis_key": k, "change": "added"}, str(kb[k])[:300]))
        for k in removed[:limit]:
            out.append(("replay.redis", {"redis_key": k, "change": "removed"}, str(ka[k])[:300]))
        for k in changed[:limit]:
            ta, va = ka[k]
            tb, vb = kb[k]
            if ta == tb == "hash":
                fields = {f: (va.get(f), vb.get(f)) for f in set(va) | set(vb) if va.get(f) != vb.get(f)}
                detail = "; ".join(f"{f}: {x!r} -> {y!r}" for f, (x, y) in sorted(fields.items()))
            else:
                detail = f"{ka[k]} -> {kb[k]}"
            out.append(("replay.redis", {"redis_key": k, "change": "changed"}, detail[:400]))
    return out


def reset_offsets(system, state, history):
    """Every group to the earliest offset of each of its topics (roles must be stopped).
    Returns a list of failures (group, topic, output)."""
    failures = []
    for group, topics in GROUP_TOPICS.items():
        committed = state.committed(group)
        for topic in topics:
            if not state.partitions(topic):
                continue
            rc, out, err = system.cli("offsets", "reset", "--group", group, "--topic", topic, "--to-earliest",
                                      "--execute", timeout=120)
            history.record("offsets_reset", group=group, topic=topic, rc=rc,
                           had_commits=any(t == topic for t, _ in committed), output=(out + err)[-500:])
            if rc != 0:
                failures.append((group, topic, (out + err)[-300:]))
    return failures
