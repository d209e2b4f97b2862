"""The SQL a Try runs, read from MariaDB's general log during a few Trys and turned into a
template that sysbench_replay.lua replays with fresh ids (the bench's "Try without Redis or
HTTP" baseline). Reading it from the log rather than writing it down keeps the baseline equal
to whatever the Try path issues today.

The capture runs against `stocksvr order-lifecycle` alone (the Try API without the relay, the
projector, the reconciler and the other pollers), on the bench's private MariaDB, so the log
holds little besides the Trys. A statement belongs to a Try when it names one of its ids (the
reservation, order and order item ids, the bucket, the merchant); BEGIN/COMMIT/ROLLBACK
belong to the Try whose statement follows/precedes them on the same connection.
"""

import json
import re
import time

from system import BenchError, http

# "251201  6:10:02\t    12 Execute\tSELECT ..." or "\t\t    12 Execute\tSELECT ..."
ENTRY = re.compile(r"^(?:\d{6}\s+\d{1,2}:\d{2}:\d{2})?\s+(\d+)\s([A-Z][a-z]+(?: [a-z]+)?)\t(.*)$")
TX = re.compile(r"^\s*(BEGIN|START TRANSACTION|COMMIT|ROLLBACK)\b", re.I)


def parse_log(text):
    """[(connection id, command, statement)] in log order; continuation lines (a statement
    spanning lines) are joined to their entry with a space."""
    entries = []
    started = False
    for line in text.splitlines():
        if line.startswith("Time") and "Command" in line:
            started = True
            continue
        if not started:
            continue
        m = ENTRY.match(line)
        if m:
            entries.append([int(m.group(1)), m.group(2), m.group(3)])
        elif entries:
            entries[-1][2] += " " + line.strip()
    return [tuple(e) for e in entries]


def window(entries, begin, end):
    """The entries between the log lines that carry the strings begin and end (the marker
    queries capture() sends around each Try), or [] when either is missing."""
    lo = next((i for i, e in enumerate(entries) if begin in e[2]), None)
    hi = next((i for i, e in enumerate(entries) if end in e[2]), None)
    if lo is None or hi is None:
        return []
    return entries[lo + 1:hi]


def try_statements(entries, marks):
    """The statements (in order) of the Try identified by marks (strings its statements may
    contain), with the transaction statements around them on the same connection. entries is
    the window of one Try (its bucket and merchant are named by every Try's statements, and
    pollers' statements come in between)."""
    stmts = [(i, c, s) for i, (c, cmd, s) in enumerate(entries) if cmd in ("Query", "Execute")]
    mine = set()
    for i, _conn, s in stmts:
        if any(re.search(r"(?<![0-9A-Za-z_])" + re.escape(m) + r"(?![0-9])", s) for m in marks):
            mine.add(i)
    # Transaction control on the same connection next to a statement of this Try.
    by_conn = {}
    for i, conn, s in stmts:
        by_conn.setdefault(conn, []).append((i, s))
    for seq in by_conn.values():
        for k, (i, s) in enumerate(seq):
            if not TX.match(s):
                continue
            verb = TX.match(s).group(1).upper()
            if verb in ("BEGIN", "START TRANSACTION"):
                j = k + 1
            else:
                j = k - 1
            if 0 <= j < len(seq) and seq[j][0] in mine:
                mine.add(i)
    return [entries[i][2] for i, _, _ in stmts if i in mine]


def templatize(statements, rid, oid, iid):
    """Replaces the ids by {RID} {OID} {IID} (whole numbers only)."""
    out = []
    for s in statements:
        if "\n" in s:
            s = s.replace("\n", " ")
        for value, name in ((rid, "{RID}"), (oid, "{OID}"), (iid, "{IID}")):
            s = re.sub(r"(?<![0-9])" + re.escape(str(value)) + r"(?![0-9])", name, s)
        out.append(s)
    return out


def shape(statements):
    """A statement list with literals blanked, to compare the captures of several Trys."""
    return [re.sub(r"'[^']*'|\b\d+\b", "?", s) for s in statements]


def general_log(db, path, on):
    """Turns MariaDB's general log (to path) on or off."""
    if on:
        db.q("SET GLOBAL log_output = 'FILE'")
        db.q("SET GLOBAL general_log_file = %s", (path,))
        db.q("SET GLOBAL general_log = 1")
    else:
        db.q("SET GLOBAL general_log = 0")


def capture(api, merchant, dish, bucket_id, log_path, id_base, mark, log_off, count=5, warm=20):
    """Runs warm + count sequential Trys against api, whose process started with the general
    log on (see general_log), each captured one between two marker queries (mark(text) sends
    SELECT 'text' on another connection), then calls log_off and reads the log. Returns
    (template lines, statements per Try, the captured Trys' (order, item, reservation) ids,
    the warm-up Trys' ids)."""
    def one(oid, iid):
        body = json.dumps({"order_id": oid, "order_item_id": iid, "merchant_id": merchant,
                           "dish_id": dish, "quantity": 1, "order_type": "INSTANT"})
        st, text = http("POST", api + "/v1/reservations", body, {"content-type": "application/json"})
        reservation = json.loads(text).get("reservation", {}) if st in (200, 201) else {}
        if reservation.get("status") != "RESERVED":
            raise BenchError(f"capture Try answered {st}: {text[:300]}")
        return reservation["reservation_id"]

    # The warm-up Trys make the process prepare its statements on every pool connection.
    done = []
    for k in range(warm):
        oid, iid = id_base + k, id_base + 500_000 + k
        done.append((oid, iid, one(oid, iid)))
    captured = []
    for k in range(count):
        oid, iid = id_base + 1000 + k, id_base + 501_000 + k
        mark(f"bench-capture-begin-{k}")
        captured.append((oid, iid, one(oid, iid)))
        # The last statements (COMMIT) reach the log before the answer does.
        mark(f"bench-capture-end-{k}")
        time.sleep(0.2)
    log_off()
    with open(log_path, encoding="utf-8", errors="replace") as f:
        entries = parse_log(f.read())
    per_try = []
    for k, (oid, iid, rid) in enumerate(captured):
        marks = [str(rid), str(oid), str(iid), bucket_id, f"merchant_id = {merchant}"]
        per_try.append(try_statements(window(entries, f"bench-capture-begin-{k}'", f"bench-capture-end-{k}'"),
                                      marks))
    shapes = [tuple(shape(s)) for s in per_try]
    # The most common shape is the Try's; another one means a Try took an unusual path (a
    # lost CAS, a retry) and is not a template.
    best = max(set(shapes), key=shapes.count)
    k = shapes.index(best)
    oid, iid, rid = captured[k]
    template = templatize(per_try[k], rid, oid, iid)
    if not template:
        raise BenchError(f"no statement of a Try found in the general log {log_path}")
    return template, [len(s) for s in per_try], captured, done
