"""The bench's arithmetic: what turns scrapes, samples and tool output into the table's figures
and ratios (report.py, pipeline.py, loads.py, checks.py, system.py, bench.py)."""

import csv
import math

import pytest

import bench
import checks
import loads
import pipeline
import report
import system

# ---- report: figures, ratios, the table and the CSV ------------------------------------------


def test_a_ratio_is_computed_from_two_figures_of_the_same_run():
    fig = report.Figures()
    fig.add("try_http_hot", "Try hot", 3000.0)
    fig.add("bare_update", "UPDATE", 1500.0)
    fig.ratio("ratio_try_update", "Try / UPDATE", "try_http_hot", "bare_update", "target >= 1")
    assert fig.get("ratio_try_update") == 2.0
    assert fig.ratios == [("Try / UPDATE", 2.0, "target >= 1")]


@pytest.mark.parametrize(("num", "den"), [(None, 1.0), (1.0, None), (1.0, 0.0)])
def test_a_ratio_without_both_figures_is_unknown_not_an_error(num, den):
    fig = report.Figures()
    fig.add("a", "a", num)
    fig.add("b", "b", den)
    fig.ratio("r", "a / b", "a", "b")
    assert fig.get("r") is None


@pytest.mark.parametrize(("value", "unit", "text"), [
    (None, "", "-"), (2.0, "ratio", "2.00x"), (12345.6, "", "12,346"), (12.34, "", "12.3"),
    (1.234, "", "1.23"), (1234567, "", "1,234,567")])
def test_numbers_are_written_with_the_precision_they_deserve(value, unit, text):
    assert report._fmt(value, unit) == text


def test_the_table_lists_figures_then_ratios_then_usage_and_durability(tmp_path):
    fig = report.Figures()
    fig.add("x", "Try through HTTP", 2500.0, p50_ms=1.5, p99_ms=20.25, note="n")
    fig.ratio_value("r", "x / y", 0.5, "aim 2")
    text = report.table(fig, "header", ["phase line"], ["PASS"], "took 1 min")
    lines = text.splitlines()
    assert lines[0] == "header"
    assert "Try through HTTP" in lines[3] and "2,500" in lines[3] and "20.2" in lines[3]
    assert lines.index("ratios (same run)") < lines.index("durability after the load")
    assert "0.50x" in text and "  phase line" in lines and lines[-1] == "took 1 min"
    report.write_csv(str(tmp_path / "f.csv"), fig)
    with open(tmp_path / "f.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["key"] for r in rows] == ["x", "r"]
    assert rows[0]["p99_ms"] == "20.25" and rows[1]["unit"] == "ratio"


def test_the_phases_csv_holds_rates_per_second(tmp_path):
    phases = [{"name": "p", "t0": 0.0, "t1": 2.0, "usage": {"procs": {"redis": {"cpu_pct": 50.0, "rss_max_mb": 8.0}},
                                                              "machine": {"user": 10.0}},
               "mysql": {"Questions": 100}, "redis": {"evalsha": 10, "cpu_s": 1.0}}]
    report.write_phases_csv(str(tmp_path / "p.csv"), phases)
    with open(tmp_path / "p.csv") as f:
        header, row = list(csv.reader(f))
    got = dict(zip(header, row, strict=True))
    assert got["mysql_per_s:Questions"] == "50.0"
    assert got["redis_evalsha_per_s"] == "5.0" and got["redis_cpu_pct"] == "50.0"
    assert got["cpu_pct:redis"] == "50.0"


# ---- pipeline: percentiles and Prometheus histograms -----------------------------------------

def test_percentiles_are_nearest_rank():
    values = list(range(1, 101))
    assert pipeline.pct(values, 50) == 50
    assert pipeline.pct(values, 99) == 99
    assert pipeline.pct(values, 100) == 100
    assert pipeline.pct([7], 99) == 7
    assert pipeline.pct([], 50) is None


def scrape(counts, total=None, labels=()):
    """A histogram's series as system.parse_metrics returns them: {le: cumulative count}."""
    out = {}
    for le, c in counts.items():
        out[("d_seconds_bucket", frozenset({("le", le), *labels}))] = c
    out[("d_seconds_count", frozenset(labels))] = counts["+Inf"]
    out[("d_seconds_sum", frozenset(labels))] = total if total is not None else 0.0
    return out


def test_histogram_quantile_interpolates_inside_the_bucket_like_prometheus():
    before = scrape({"0.1": 0, "0.2": 0, "+Inf": 0})
    after = scrape({"0.1": 50, "0.2": 100, "+Inf": 100})
    value, n = pipeline.histogram_quantile(before, after, "d_seconds", 0.75)
    assert n == 100
    assert math.isclose(value, 0.15)
    # Over the increase only: what the scrape before held is not counted.
    value, n = pipeline.histogram_quantile(after, scrape({"0.1": 50, "0.2": 100, "+Inf": 110}), "d_seconds", 0.5)
    assert n == 10 and value == 0.2  # all ten went above 0.2: the last finite bound


def test_histogram_quantile_of_nothing_observed_is_unknown():
    s = scrape({"0.1": 5, "+Inf": 5})
    assert pipeline.histogram_quantile(s, s, "d_seconds", 0.99) == (None, 0)


def test_the_share_over_a_bound_is_exact():
    before = scrape({"0.1": 0, "+Inf": 0})
    after = scrape({"0.1": 90, "+Inf": 100})
    assert math.isclose(pipeline.histogram_share_over(before, after, "d_seconds", 0.1), 0.1)
    assert pipeline.histogram_share_over(before, after, "d_seconds", 0.5) is None  # not a bound


def test_the_mean_comes_from_sum_and_count_of_matching_series():
    before = {**scrape({"+Inf": 0}, 0.0, {("stage", "lua")}), **scrape({"+Inf": 0}, 0.0, {("stage", "commit")})}
    after = {**scrape({"+Inf": 4}, 2.0, {("stage", "lua")}), **scrape({"+Inf": 1}, 9.0, {("stage", "commit")})}
    assert pipeline.histogram_mean(before, after, "d_seconds", {"stage": "lua"}) == (4, 0.5)
    assert pipeline.histogram_mean(before, before, "d_seconds") == (0, None)


def test_the_slowest_seconds_are_those_with_the_most_slow_orders():
    timed = [(100.0, 0.01), (100.5, 0.3), (101.2, 0.5), (101.3, 0.2), (102.0, 0.05)]
    assert pipeline.slow_seconds(timed, 0.1) == [(1, 2, 2, 0.5), (0, 2, 1, 0.3)]
    assert pipeline.slow_seconds([], 0.1) == []


def test_the_drain_rate_leaves_out_the_start():
    assert pipeline.drain_rate(10.0, 100, 20.0, 1100) == 100.0
    assert pipeline.drain_rate(10.0, 100, 10.0, 100) is None


# ---- loads: the tools' output ---------------------------------------------------------------

def test_a_percentile_of_sysbench_s_histogram():
    hist = [(1.0, 50), (2.0, 40), (10.0, 10)]
    assert loads._hist_pct(hist, 50) == 1.0
    assert loads._hist_pct(hist, 90) == 2.0
    assert loads._hist_pct(hist, 99) == 10.0
    assert loads._hist_pct([], 50) is None


def test_a_number_missing_from_a_tool_s_output_is_a_bench_error():
    assert loads._num(r"total:\s+(\d+)", "total:   42") == 42.0
    assert loads._num(r"errors:\s+(\d+)", "", default=0) == 0
    with pytest.raises(system.BenchError):
        loads._num(r"total:\s+(\d+)", "nothing")


# ---- checks: what counts as acknowledged ----------------------------------------------------

def test_acknowledged_items_are_2xx_reserved_answers_and_all_items_of_a_reserved_order():
    runs = [("single", [(201, "11", "RESERVED"), (200, "12", "REJECTED"), (503, "13", "RESERVED"),
                        (201, "-", "RESERVED")]),
            ("order", [(200, "77", "ALL_RESERVED"), (200, "78", "PARTIAL")])]
    items, answered = checks.acknowledged(runs)
    assert items == {11, 770, 771, 772}
    assert answered == 4  # 2xx with an id: 11, 12, 77, 78


# ---- system: Prometheus text, the sampler, settings ----------------------------------------

def test_prometheus_text_is_parsed_into_series():
    text = ('# HELP x\nstocksvr_up 1\nreq_total{route="/v1",code="201"} 5\nreq_total{route="/v1",code="503"} 2\n'
            'bad line\nh_bucket{le="+Inf"} 3\n')
    m = system.parse_metrics(text)
    assert system.metric_sum(m, "req_total") == 7
    assert system.metric_sum(m, "req_total", code=201) == 5
    assert system.metric_sum(m, "stocksvr_up") == 1
    assert system.metric_sum(m, "missing") == 0


def test_the_sampler_turns_ticks_into_cpu_percent_of_a_core():
    s = system.Sampler()
    tck = system.CLK_TCK
    s.samples = [(100.0, {"p": (0, 1024)}, [0, 0, 0, 100, 0, 0, 0, 0]),
                 (102.0, {"p": (tck, 2048)}, [50, 0, 50, 100, 0, 0, 0, 0])]
    w = s.window(100.0, 102.0)
    assert math.isclose(w["procs"]["p"]["cpu_pct"], 50.0)
    assert w["procs"]["p"]["rss_max_mb"] == 2.0
    assert math.isclose(w["machine"]["user"], 50.0) and w["machine"]["idle"] == 0.0
    assert s.window(200.0, 201.0) == {"procs": {}, "machine": {}}


def test_settings_become_stocksvr_variables():
    assert bench.settings_env(["reservation.try_group_max=32", " kafka.properties.linger_ms = 5"]) == {
        "STOCKSVR__RESERVATION__TRY_GROUP_MAX": "32", "STOCKSVR__KAFKA__PROPERTIES__LINGER_MS": "5"}
    with pytest.raises(system.BenchError):
        bench.settings_env(["no_section=1"])


def test_log_flushes_fall_back_to_log_writes_where_mariadb_dropped_fsyncs():
    assert bench.log_flushes({"Innodb_os_log_fsyncs": 7, "Innodb_log_writes": 9}) == 7
    assert bench.log_flushes({"Innodb_log_writes": 9}) == 9
    assert bench.log_flushes({}) == 0


def test_the_table_line_lists_rows_per_try_by_table():
    rec = {"tables": {"inventory_reservation": (10, 20), "inventory_outbox": (0, 40), "noise": (0, 0)}}
    assert bench.Bench.table_line(rec, 10, "Try") == (
        "rows changed/Try by table: inventory_outbox 4.00, inventory_reservation 2.00")
    assert bench.Bench.table_line(rec, 0, "Try") == ""


def test_rows_changed_per_unit_sum_every_table_and_ignore_reads():
    rec = {"tables": {"inventory_reservation": (10, 20), "inventory_outbox": (99, 15), "noise": (5, 0)}}
    assert bench.Bench.rows_changed(rec, 10) == 3.5
    assert bench.Bench.rows_changed(rec, 0) is None
    assert bench.Bench.rows_changed({}, 10) is None


def test_percentiles_of_whole_ranks_do_not_round_up_past_them():
    values = list(range(1, 1001))
    assert pipeline.pct(values, 99.9) == 999
    assert pipeline.pct(values, 99) == 990
    assert pipeline.pct(list(range(1, 11)), 95) == 10  # rank 9.5 -> 10


def test_the_bench_s_order_created_fits_its_schema():
    import json
    import os

    from fastavro import parse_schema
    from fastavro.validation import validate

    from stocksvr_harness import SCHEMAS

    p = pipeline.OrderProducer("127.0.0.1:9", "http://127.0.0.1:9/apis/ccompat/v7", "ns.order.lifecycle.v1")
    p.serializers.value = lambda event, record, topic: (event, record, topic)  # no registry here
    event, record, topic = p._value(7, 70, 501, 1796620000.25)
    assert (event, topic) == ("OrderCreated", "ns.order.lifecycle.v1")
    assert record["occurred_at"] == "2026-12-07T05:06:40.250+00:00"
    assert record["data"]["inventory_reservation_ids"] == [70]
    with open(os.path.join(SCHEMAS, "OrderCreated.avsc"), encoding="utf-8") as f:
        assert validate(record, parse_schema(json.load(f)), raise_errors=True)
