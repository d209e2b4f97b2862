"""Durability after the load: every Try answered 2xx RESERVED has its row (RESERVED, or
CONFIRMED when the bench's OrderCreated confirmed it), and Redis holds exactly what MySQL says
for every bench bucket (reserved = sum of the held quantity of RESERVED/CREATED_RESERVED rows,
sold = that of CONFIRMED rows, available + reserved + sold = total); the snapshot the projector
books follows Redis."""

from stocksvr_harness.codes import CONFIRMED, CREATED_RESERVED, INTERMEDIATE, RESERVED, sql_list
from stocksvr_harness.wait import WaitTimeout, wait_until


def wait_settled(db, merchant, timeout):
    """Waits until no reservation of the merchant is in an intermediate status (a request
    that timed out on the client may still be finishing, or wait for the recovery worker)."""
    seen = {"n": None}

    def settled():
        seen["n"] = db.one("SELECT COUNT(*) FROM inventory_reservation WHERE merchant_id = %s AND status IN "
                           f"{sql_list(INTERMEDIATE)}", (merchant,))
        return seen["n"] == 0

    try:
        wait_until(settled, timeout, "no reservation of the merchant in an intermediate status", interval=1.0)
    except WaitTimeout:
        pass  # the caller reports how many are left
    return seen["n"]


def acknowledged(runs):
    """Order item ids of every 2xx RESERVED answer: runs is [(mode, responses)]; an order-level
    answer names its order, whose items are the order id followed by 0, 1, 2 (counted when
    the answer says all_reserved)."""
    items, answered = set(), 0
    for mode, responses in runs:
        for status, ident, outcome in responses:
            if not 200 <= status < 300 or ident == "-":
                continue
            answered += 1
            if mode != "order":  # single, repeat
                if outcome == "RESERVED":
                    items.add(int(ident))
            elif outcome.startswith("ALL"):  # all_reserved (tests/bench/lua/wrk_try.lua)
                items.update(int(ident + str(k)) for k in range(3))
    return items, answered


def redis_stock(r, merchant, dish, stock_date):
    key = f"inv:{{{merchant}:{dish}:{stock_date.isoformat()}}}:stock"
    h = r.hgetall(key)
    return {k.decode(): int(v) for k, v in h.items() if k.decode() in
            ("total", "available", "reserved", "sold", "deficit", "version")}


def check(db, r, merchant, runs, extra_items, settle_timeout=90):
    """Returns (ok, lines, projected) of the durability check; projected: the ledger and the
    snapshot agree with Redis in every bucket (the projector has caught up)."""
    lines = []
    left = wait_settled(db, merchant, settle_timeout)
    if left:
        lines.append(f"FAIL {left} reservations still intermediate after {settle_timeout}s")
    acked, answered = acknowledged(runs)
    acked.update(extra_items)
    rows = db.q("SELECT order_item_id, status FROM inventory_reservation WHERE merchant_id = %s",
                (merchant,))
    status = {int(i): int(s) for i, s in rows}
    missing = [i for i in acked if i not in status]
    wrong = [i for i in acked if i in status and status[i] not in (RESERVED, CONFIRMED)]
    ok = not left and not missing and not wrong
    lines.append(f"{len(acked):,} order items answered 2xx RESERVED ({answered:,} 2xx answers, an order-level "
                 f"one for 3 items; {len(status):,} reservation rows): {len(missing)} without a row, "
                 f"{len(wrong)} in another status")
    if missing:
        lines.append(f"FAIL without a row, e.g. {sorted(missing)[:5]}")
    if wrong:
        lines.append(f"FAIL not RESERVED/CONFIRMED, e.g. {[(i, status[i]) for i in sorted(wrong)[:5]]}")
    sums = db.q(
        "SELECT b.stock_bucket_id, b.dish_id, b.stock_date, "
        f" COALESCE(SUM(IF(r.status IN ({RESERVED},{CREATED_RESERVED}), r.quantity - r.refunded_quantity, 0)), 0),"
        f" COALESCE(SUM(IF(r.status = {CONFIRMED}, r.quantity - r.refunded_quantity, 0)), 0),"
        " s.reserved_stock, s.sold_stock"
        " FROM dish_stock_baseline b"
        " LEFT JOIN inventory_reservation r ON r.stock_bucket_id = b.stock_bucket_id"
        " LEFT JOIN dish_stock_snapshot s ON s.stock_bucket_id = b.stock_bucket_id"
        " WHERE b.merchant_id = %s GROUP BY b.stock_bucket_id, b.dish_id, b.stock_date,"
        " s.reserved_stock, s.sold_stock", (merchant,))
    ledger = {b: (int(rd), int(sd)) for b, rd, sd in db.q(
        "SELECT stock_bucket_id, SUM(reserved_delta), SUM(sold_delta) FROM inventory_ledger"
        " WHERE merchant_id = %s GROUP BY stock_bucket_id", (merchant,))}
    bad, snap_behind, ledger_behind, buckets, units = [], [], [], 0, 0
    for bucket, dish, day, reserved, sold, snap_reserved, snap_sold in sums:
        buckets += 1
        st = redis_stock(r, merchant, dish, day)
        reserved, sold = int(reserved), int(sold)
        units += reserved + sold
        if (not st or st["reserved"] != reserved or st["sold"] != sold
                or st["available"] + st["reserved"] + st["sold"] != st["total"]):
            bad.append((bucket, st, reserved, sold))
            continue
        if snap_reserved is None or (int(snap_reserved), int(snap_sold)) != (st["reserved"], st["sold"]):
            snap_behind.append(bucket)
        if ledger.get(bucket, (0, 0)) != (st["reserved"], st["sold"]):
            ledger_behind.append(bucket)
    ok = ok and not bad
    good = buckets - len(bad)
    lines.append(f"{buckets} buckets, {units:,} units held: Redis reserved/sold = the reservation "
                 f"rows' sums and available+reserved+sold = total in {good}; the ledger's sums = "
                 f"Redis in {good - len(ledger_behind)}, the snapshot = Redis in {good - len(snap_behind)}")
    for bucket, st, reserved, sold in bad[:5]:
        lines.append(f"FAIL {bucket}: Redis {st} vs MySQL reserved {reserved} sold {sold}")
    if snap_behind or ledger_behind:
        lines.append(f"note: projection behind Redis (snapshot {len(snap_behind)}, ledger "
                     f"{len(ledger_behind)} buckets), e.g. {(snap_behind or ledger_behind)[:3]}")
    return ok, lines, not snap_behind and not ledger_behind
