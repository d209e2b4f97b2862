"""Retried Trys (issue 12: "a client that retries a Try it did not hear back from is the normal
case"): the same Try sent 1,000 times at once over 1,000 connections, and a settled Try
repeated by 64 connections next to the fresh Trys of the hot dish. Each answer joins the
durability check, which fails if the repeats moved Redis more than once."""

import asyncio
import json
import time

import checks
import parts
import pipeline
from bench import BIG, COLD_BASE, HOT_DISH
from system import BenchError, http

SAME_TRY_TIMES = 1000
# An order item of its own, outside wrk's ids (2-digit prefix + 12 digits).
SAME_TRY_ITEM = 730_000_000_001


async def _one(host, port, request, clock, ready, gate):
    """One connection: open before the gate opens, then sends the Try and reads the whole
    answer (the server closes after it: `Connection: close`). (status, body, seconds)."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    finally:
        ready.append(1)  # a connection that failed counts too: nobody waits for it
    try:
        await gate.wait()
        writer.write(request)
        await writer.drain()
        raw = await reader.read()
        took = time.monotonic() - clock[0]
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        status = 0  # no answer, or not HTTP
    return status, body.decode("utf-8", "replace"), took


async def _all_at_once(host, port, request, n):
    """n connections opened first, then the same request on all of them at once."""
    gate, clock, ready = asyncio.Event(), [0.0], []
    tasks = [asyncio.create_task(_one(host, port, request, clock, ready, gate)) for _ in range(n)]
    deadline = time.monotonic() + 30
    while len(ready) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    clock[0] = time.monotonic()
    gate.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def same_try_at_once(b, r):
    """The same Try (one order item of a dish of its own, quantity 1) sent SAME_TRY_TIMES times at
    once, each on its own connection. Asserts what the issue asks: one reservation, one Redis
    effect; figures: the time until the last answer, p50/p99 of the answers, their codes."""
    # A dish of its own: no other load, and no recovery of another load's Try, moves its
    # bucket, so "Redis moved by one unit" is this Try's alone.
    dish = COLD_BASE + b.P["cold_dishes"]  # the first dish after the cold ones
    st, text = http("POST", r.url("/admin/buckets"),
                    json.dumps({"merchant_id": b.merchant, "dish_id": dish, "total": BIG}),
                    {"content-type": "application/json", "authorization": f"Bearer {b.token}"})
    if st != 200:
        raise BenchError(f"the same-Try bucket: POST /admin/buckets answered {st}: {text[:200]}")
    day = b.db.one("SELECT stock_date FROM dish_stock_baseline WHERE merchant_id = %s AND dish_id = %s",
                   (b.merchant, dish))
    before = checks.redis_stock(b.redis, b.merchant, dish, day)
    body = json.dumps({"order_id": SAME_TRY_ITEM, "order_item_id": SAME_TRY_ITEM, "merchant_id": b.merchant,
                       "dish_id": dish, "quantity": 1, "order_type": "INSTANT"})
    request = (f"POST /v1/reservations HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()
    host, port = r.url("").split("//", 1)[1].rstrip("/").split(":")
    with b.phase("same-try-1000") as rec:
        answers = asyncio.run(_all_at_once(host, int(port), request, SAME_TRY_TIMES))
    errors = [a for a in answers if isinstance(a, BaseException)]
    answers = [a for a in answers if not isinstance(a, BaseException)]
    codes, ids, responses = {}, set(), []
    for status, text, _ in answers:
        codes[status] = codes.get(status, 0) + 1
        try:
            doc = json.loads(text)
        except ValueError:
            doc = {}
        res = doc.get("reservation") if isinstance(doc.get("reservation"), dict) else doc
        if 200 <= status < 300:
            ids.add(res.get("id"))
        responses.append((status, str(SAME_TRY_ITEM) if 200 <= status < 300 else "-",
                          str(res.get("status") or doc.get("error") or "-")))
    b.runs.append(("single", responses))
    rows = b.db.one("SELECT COUNT(*) FROM inventory_reservation WHERE order_item_id = %s", (SAME_TRY_ITEM,))
    after = checks.redis_stock(b.redis, b.merchant, dish, day)
    moved = after["reserved"] - before["reserved"]
    took = sorted(t for _, _, t in answers)
    last = took[-1] if took else None
    note = (f"{SAME_TRY_TIMES:,} connections, one order item of a dish of its own; answers "
            + ", ".join(f"{c}: {n:,}" for c, n in sorted(codes.items()))
            + (f", {len(errors)} connection errors ({errors[0]!r})" if errors else "")
            + f"; {len(ids)} reservation id(s) in the 2xx answers; {rows} row(s); Redis reserved moved by {moved}")
    b.fig.add("same_try_1000", f"the same Try {SAME_TRY_TIMES:,} times at once, until the last answer",
              None if last is None else last * 1000, "ms",
              p50_ms=pipeline.pct(took, 50) * 1000 if took else None,
              p99_ms=pipeline.pct(took, 99) * 1000 if took else None, note=note)
    b.phase_line(rec)
    if len(ids) > 1 or rows != 1 or moved != 1:
        raise BenchError(f"the same Try {SAME_TRY_TIMES} times at once: {note}")
    return last


def settled_repeats(b, r):
    """A settled Try repeated: 64 connections cycling over 100 order items each thread (wrk
    mode `repeat`), so all but the first Trys of each item repeat one that settled. Beside the
    hot dish's fresh Trys of the same run: what a retry costs next to a Try."""
    res = parts.wrk_load(b, r, "try-repeat-64", "repeat", 64, b.P["sweep_secs"], HOT_DISH, 1)
    created = sum(1 for st, _, _ in res["responses"] if st == 201)
    repeated = sum(1 for st, _, _ in res["responses"] if st == 200)
    hot = b.raw.get("try-hot-64")  # part_http's fresh Trys of the hot dish
    ratio = res["rate"] / hot["rate"] if hot and hot["rate"] else None
    b.fig.add("try_repeat_64", "a settled Try repeated, hot dish, 64 conn", res["rate"],
              p50_ms=res["p50_ms"], p99_ms=res["p99_ms"], concurrency=64,
              note=(f"{repeated:,} repeats (200), {created:,} created (201); "
                    + (f"{ratio:.1f}x the hot dish's fresh Trys; " if ratio else "") + res["note"]))


def part_retries(b):
    """Both loads against the `stocksvr all` of part_http, after it."""
    parts.quiet(b)
    b.log(f"the same Try {SAME_TRY_TIMES:,} times at once, {SAME_TRY_TIMES:,} connections")
    same_try_at_once(b, b.all)
    parts.quiet(b)
    b.log(f"a settled Try repeated, hot dish, 64 connections, {b.P['sweep_secs']} s")
    settled_repeats(b, b.all)
