"""The soak's verdict and sampling helpers: each rule passes a steady run and fails the run it
exists to catch (growing RSS or descriptors, a p99 jump, growing lag or backlog, a load that
never reached its rate)."""

import soak
import verdict

RATE = 1000


def run(minutes, **over):
    """Samples every 10 s of a steady run of `minutes`; `over` maps a column to a function of
    t (seconds) that replaces it."""
    rows = []
    for i in range(1, int(minutes * 6) + 1):
        t = i * 10.0
        row = {"t": t, "rss_mb": 120.0 + (i % 3), "fds": 90 + i % 2, "lag_total": 40.0 + i % 7,
               "outbox_backlog": 15.0 + i % 5, "try_p99_ms": 20.0 + i % 4, "trys_per_s": 995.0,
               "reserved_per_s": 995.0, "confirmed_per_s": 990.0}
        for col, f in over.items():
            row[col] = f(t)
        rows.append(row)
    return rows, minutes * 60.0


def failed(lines):
    return [line for line in lines if line.startswith("FAIL")]


def test_a_steady_two_hour_run_passes():
    ok, lines = verdict.judge(*run(120), RATE)
    assert ok, lines
    assert not failed(lines)
    assert any("first hour" in line for line in lines)


def test_a_steady_short_run_passes_and_says_its_reference_is_the_first_half():
    ok, lines = verdict.judge(*run(15), RATE)
    assert ok, lines
    assert any("first half (run shorter than 2 h)" in line for line in lines)
    assert "a third of a run" in lines[0]


def test_growing_rss_fails():
    ok, lines = verdict.judge(*run(120, rss_mb=lambda t: 120 + t / 300), RATE)  # +24 MB/h
    assert not ok
    assert len(failed(lines)) == 1 and "rss_mb growth" in failed(lines)[0]


def test_rss_growth_during_the_warm_up_is_not_judged():
    ok, lines = verdict.judge(*run(120, rss_mb=lambda t: 60 + min(t, 500) / 5), RATE)
    assert ok, lines


def test_growing_descriptors_fail():
    ok, lines = verdict.judge(*run(60, fds=lambda t: 90 + int(t / 120)), RATE)
    assert not ok
    assert "fds growth" in failed(lines)[0]


def test_a_p99_jump_fails():
    ok, lines = verdict.judge(*run(120, try_p99_ms=lambda t: 20 if t < 5400 else 35), RATE)
    assert not ok
    assert len(failed(lines)) == 1 and "p99" in failed(lines)[0]


def test_one_slow_window_does_not_fail_the_p99_rule():
    ok, lines = verdict.judge(*run(120, try_p99_ms=lambda t: 500 if t == 6000 else 20), RATE)
    assert ok, lines


def test_a_growing_backlog_fails():
    ok, lines = verdict.judge(*run(120, outbox_backlog=lambda t: t / 2), RATE)
    assert not ok
    assert any("outbox_backlog bounded" in line for line in failed(lines))


def test_lag_above_the_absolute_bound_fails_even_when_flat():
    ok, lines = verdict.judge(*run(60, lag_total=lambda t: 40_000), RATE)
    assert not ok
    assert "lag_total bounded" in failed(lines)[0]


def test_a_small_lag_may_double_under_the_floor():
    ok, lines = verdict.judge(*run(60, lag_total=lambda t: 3 if t < 2100 else 300), RATE)
    assert ok, lines


def test_a_load_short_of_its_rate_fails():
    ok, lines = verdict.judge(*run(30, trys_per_s=lambda t: 700.0), RATE)
    assert not ok
    assert "load" in failed(lines)[0]


def test_reservations_left_unconfirmed_fail():
    ok, lines = verdict.judge(*run(30, confirmed_per_s=lambda t: 400.0), RATE)
    assert not ok
    assert "confirms" in failed(lines)[0]


def test_too_few_samples_fail():
    ok, lines = verdict.judge(*run(0.5), RATE)
    assert not ok
    assert "too few samples" in lines[-1]


def test_missing_series_fail():
    ok, lines = verdict.judge(*run(30, outbox_backlog=lambda t: None), RATE)
    assert not ok
    assert "outbox_backlog: no samples" in failed(lines)[0]


def test_warm_up_is_ten_minutes_or_a_third_of_a_short_run():
    assert verdict.warmup(7200) == 600
    assert verdict.warmup(900) == 300


METRICS = """# HELP stocksvr_consumer_group_lag Records behind.
# TYPE stocksvr_consumer_group_lag gauge
stocksvr_consumer_group_lag{group="ns.projector",topic="ns.t",partition="0"} 5
stocksvr_consumer_group_lag{group="ns.projector",topic="ns.t",partition="1"} 7
stocksvr_consumer_group_lag{group="ns.order-lifecycle",topic="ns.o",partition="0"} 3
stocksvr_outbox_backlog 12
stocksvr_outbox_oldest_pending_seconds 0.4
stocksvr_reservation_operations_total{operation="confirm",outcome="done"} 100
stocksvr_reservation_operations_total{operation="confirm",outcome="already_done"} 4
stocksvr_reservation_operations_total{operation="try",outcome="reserved"} 200
"""


def test_metric_figures_sum_lag_per_group_and_count_confirmed():
    f = soak.metric_figures(METRICS)
    assert f["lag_total"] == 15
    assert (f["lag_worst_group"], f["lag_worst"]) == ("ns.projector", 12)
    assert (f["outbox_backlog"], f["outbox_oldest_s"], f["confirmed_total"]) == (12, 0.4, 100)


def test_metric_figures_without_the_gauges_are_unknown():
    f = soak.metric_figures("other_metric 1\n")
    assert f["lag_total"] is None and f["outbox_backlog"] is None


def test_pct_is_nearest_rank():
    assert soak.pct(list(range(1, 101)), 99) == 99
    assert soak.pct([5.0], 99) == 5.0
    assert soak.pct([], 99) is None
