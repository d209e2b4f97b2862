"""The soak's verdict (issue 51, item 6), pure: the samples of a run in, PASS or FAIL with one
line per rule out. tests/soak/test_soak.py proves each rule can fail.

The rules (docs/testing.md, "Soak", says the same):

  warm-up      the first 10 minutes are not judged (a third of the run when it is shorter than
               30 minutes: a smoke run has no 10 minutes to spare)
  growth       RSS and open descriptors: the median of the last GROWTH_SAMPLES samples is less
               than 10% above the median of the first GROWTH_SAMPLES after the warm-up (medians,
               so one sample caught mid-allocation neither makes nor breaks the run)
  p99          the reference is the median of the 10-s Try p99s of the first hour after the
               warm-up (of the first half of the judged part when the run is shorter than
               2 hours); every later 5-minute block's median 10-s p99 stays within 1.5x of it
  bounded      consumer lag (all groups, summed) and outbox backlog: the median of the last
               quarter of the judged samples is at most twice the median of the first quarter
               (or at most one second of Trys, `rate` records, when that is more: 2 x 0 would
               forbid a single record), and no judged sample is above 30 seconds of Trys
               (30 x rate). Medians of quarters, not maxima of halves: a backlog growing
               steadily from the warm-up never doubles its maximum between halves, and one
               spike (a checkpoint, a rebalance) is not a trend
  load         the soak ran the flow it claims: Trys answered 2xx per second at least 90% of
               the asked rate, and confirms per second at least 90% of the Trys RESERVED per
               second (both means over the judged part)
"""

import statistics

WARMUP_S = 600
SHORT_RUN_S = 1800
GROWTH_LIMIT = 0.10
GROWTH_SAMPLES = 12  # two minutes of 10-s samples
P99_FACTOR = 1.5
P99_REFERENCE_S = 3600
LONG_RUN_S = 7200
P99_BLOCK = 30  # samples: five minutes
BOUND_FACTOR = 2.0
BOUND_FLOOR_S = 1  # seconds of Trys
BOUND_ABSOLUTE_S = 30
LOAD_SHARE = 0.9
MIN_SAMPLES = 6


def warmup(duration):
    """Seconds at the start of a run of `duration` seconds that are not judged."""
    return WARMUP_S if duration >= SHORT_RUN_S else duration / 3


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _max(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def growth(post, column):
    """(first median, last median, growth) of `column` over the judged samples."""
    k = max(1, min(GROWTH_SAMPLES, len(post) // 4))
    first = _median(r[column] for r in post[:k])
    last = _median(r[column] for r in post[-k:])
    if first is None or last is None or first <= 0:
        return first, last, None
    return first, last, last / first - 1


def p99_blocks(post, duration, warm):
    """(reference end in seconds, reference median p99, [(block start, block median p99)])."""
    if duration >= LONG_RUN_S:
        ref_end = warm + P99_REFERENCE_S
    else:
        ref_end = warm + (duration - warm) / 2
    ref = _median(r["try_p99_ms"] for r in post if r["t"] < ref_end)
    rest = [r for r in post if r["t"] >= ref_end]
    blocks = []
    for i in range(0, len(rest), P99_BLOCK):
        block = rest[i:i + P99_BLOCK]
        # A short tail block joins the one before it: a minute alone is too few windows.
        if len(block) < P99_BLOCK // 3 and blocks:
            block = rest[i - P99_BLOCK:i + P99_BLOCK]
            blocks[-1] = (block[0]["t"], _median(r["try_p99_ms"] for r in block))
            continue
        blocks.append((block[0]["t"], _median(r["try_p99_ms"] for r in block)))
    return ref_end, ref, blocks


def bounded(post, column, rate):
    """(first-quarter median, last-quarter median, limit, overall max, absolute bound, ok) of
    `column` over the judged samples."""
    q = max(1, len(post) // 4)
    first, last = _median(r[column] for r in post[:q]), _median(r[column] for r in post[-q:])
    peak = _max(r[column] for r in post)
    absolute = BOUND_ABSOLUTE_S * rate
    if first is None or last is None:
        return first, last, None, peak, absolute, False
    limit = max(BOUND_FACTOR * first, BOUND_FLOOR_S * rate)
    return first, last, limit, peak, absolute, last <= limit and peak <= absolute


def judge(rows, duration, rate):
    """(passed, lines) for the samples `rows` (dicts with the CSV's columns, `t` in seconds
    from the start of the load) of a run of `duration` seconds at `rate` Trys/s asked."""
    warm = warmup(duration)
    post = [r for r in rows if r["t"] >= warm]
    lines = [f"judged: {len(post)} samples from {warm / 60:.1f} min (warm-up "
             f"{'10 min' if warm == WARMUP_S else 'a third of a run shorter than 30 min'})"]
    if len(post) < MIN_SAMPLES:
        return False, [*lines, f"FAIL too few samples after the warm-up ({len(post)} < {MIN_SAMPLES})"]
    ok = True

    def check(passed, text):
        nonlocal ok
        ok = ok and passed
        lines.append(f"{'ok  ' if passed else 'FAIL'} {text}")

    for column, unit in (("rss_mb", "MB"), ("fds", "")):
        first, last, g = growth(post, column)
        if g is None:
            check(False, f"{column}: no samples")
            continue
        check(g < GROWTH_LIMIT, f"{column} growth {g:+.1%} (median {first:.1f}{unit} -> {last:.1f}{unit}; "
                                f"limit +{GROWTH_LIMIT:.0%})")

    ref_end, ref, blocks = p99_blocks(post, duration, warm)
    which = "first hour" if duration >= LONG_RUN_S else "first half (run shorter than 2 h)"
    if ref is None or not blocks:
        check(False, f"p99: no reference or nothing after it (reference to {ref_end / 60:.1f} min)")
    else:
        worst_t, worst = max(blocks, key=lambda b: b[1] or 0)
        check(all(b[1] is not None and b[1] <= P99_FACTOR * ref for b in blocks),
              f"p99: reference {ref:.1f} ms ({which}, median of 10-s p99s to {ref_end / 60:.1f} min); "
              f"worst 5-min block {worst:.1f} ms at {worst_t / 60:.1f} min = {worst / ref:.2f}x "
              f"(limit {P99_FACTOR}x)")

    for column in ("lag_total", "outbox_backlog"):
        first, last, limit, peak, absolute, b_ok = bounded(post, column, rate)
        if limit is None:
            check(False, f"{column}: no samples")
            continue
        check(b_ok, f"{column} bounded: median {first:.0f} (first quarter) -> {last:.0f} (last quarter), "
                    f"limit {limit:.0f} (2x, at least {BOUND_FLOOR_S} s of Trys); max {peak:.0f}, "
                    f"limit {absolute:.0f} ({BOUND_ABSOLUTE_S} s of Trys)")

    trys = _mean(r["trys_per_s"] for r in post)
    reserved = _mean(r["reserved_per_s"] for r in post)
    confirmed = _mean(r["confirmed_per_s"] for r in post)
    check(trys is not None and trys >= LOAD_SHARE * rate,
          f"load: {trys or 0:.0f} Trys/s answered 2xx (asked {rate:.0f}, at least {LOAD_SHARE:.0%})")
    check(reserved is not None and confirmed is not None and confirmed >= LOAD_SHARE * reserved,
          f"confirms: {confirmed or 0:.0f}/s CONFIRMED for {reserved or 0:.0f}/s RESERVED "
          f"(at least {LOAD_SHARE:.0%})")
    return ok, lines


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None
