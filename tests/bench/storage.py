"""What the run's data costs to keep: Redis bytes per bucket and per reservation, MariaDB bytes
and rows per reservation, table by table. The capacity figures of docs/scaling.md come from
here. Runs after the durability check, when every reservation of the run has been Tried and the
order-level ones confirmed, so each table holds what a day of such traffic leaves behind."""

import collections
import re

# inv:{<merchant>:<dish>:<date>}:stock | :reservation:<id> | :op:<operation id>
_KIND = re.compile(r"^inv:\{[^}]*\}:(stock|reservation|op)(?::|$)")
_SAMPLE = 2000  # MEMORY USAGE calls per key kind: the keys of one kind differ by a few bytes


def _redis(b):
    counts = collections.Counter()
    sizes = collections.defaultdict(list)
    for key in b.redis.scan_iter(match=f"inv:{{{b.merchant}:*", count=5000):
        m = _KIND.match(key.decode("utf-8", "replace"))
        kind = m.group(1) if m else "other"
        counts[kind] += 1
        if len(sizes[kind]) < _SAMPLE:
            sizes[kind].append(b.redis.memory_usage(key, samples=0) or 0)
    mean = {k: sum(v) / len(v) for k, v in sizes.items() if v}
    return counts, mean


def _mariadb(b):
    tables = [r[0] for r in b.db.q("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_schema = %s AND table_type = 'BASE TABLE'", (b.dbname,))]
    out = {}
    for t in tables:
        if t.startswith("_sqlx"):
            continue
        # InnoDB's sizes are page-granular estimates; ANALYZE refreshes them after the load.
        b.db.q(f"ANALYZE TABLE `{t}`")
        rows = b.db.one(f"SELECT COUNT(*) FROM `{t}`")
        size = b.db.q("SELECT data_length, index_length FROM information_schema.tables "
                      "WHERE table_schema = %s AND table_name = %s", (b.dbname, t))[0]
        out[t] = (int(rows), int(size[0]) + int(size[1]))
    return out


def part_storage(b):
    b.log("storage: Redis bytes per bucket and reservation, MariaDB rows and bytes per reservation")
    counts, mean = _redis(b)
    buckets, fences, ops = counts["stock"], counts["reservation"], counts["op"]
    if not buckets or not fences:
        b.notes.append(f"storage: nothing to measure ({dict(counts)})")
        return
    ops_per = ops / fences
    per_res = mean["reservation"] + ops_per * mean.get("op", 0)
    b.fig.add("redis_bucket_bytes", "Redis bytes per bucket (stock hash)", mean["stock"], "B",
              note=f"{buckets:,} buckets, MEMORY USAGE")
    b.fig.add("redis_reservation_bytes", "Redis bytes per reservation (fence + op records)", per_res, "B",
              note=f"{fences:,} fences of {mean['reservation']:.0f} B, {ops_per:.2f} op records of "
                   f"{mean.get('op', 0):.0f} B each (op records live op_ttl_days)")
    tables = _mariadb(b)
    reservations = tables.get("inventory_reservation", (0, 0))[0]
    if reservations:
        total = sum(size for _, size in tables.values())
        detail = ", ".join(f"{t} {rows / reservations:.2f} rows {size / max(rows, 1):.0f} B/row"
                           for t, (rows, size) in sorted(tables.items(), key=lambda kv: -kv[1][1])
                           if rows)
        b.fig.add("mariadb_reservation_bytes", "MariaDB bytes per reservation (all tables)",
                  total / reservations, "B", note=f"{reservations:,} reservations, data + indexes")
        b.notes.append(f"storage per reservation: {detail}")
    b.raw["storage"] = {"redis_counts": dict(counts), "redis_mean_bytes": mean,
                        "mariadb": {t: {"rows": r, "bytes": s} for t, (r, s) in tables.items()}}
