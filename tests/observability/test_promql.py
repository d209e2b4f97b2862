"""Unit tests of the PromQL helpers the dashboard and rule lint rely on: obslib.metric_names
(which metrics an expression selects), obslib.substitute (Grafana variables), promql.check
(labels an expression's result carries, and matchers against the catalog) and
promql.series_problems (promtool input series). Were the self-test of lint_dashboards.py."""

import pytest

import obslib
import promql

CATALOG = {
    "a_total": {"type": "counter", "labels": ["processor", "class"],
                "label_values": {"class": ["invalid", "undecodable"]}},
    "g": {"type": "gauge", "labels": ["group", "topic"]},
    "h_seconds": {"type": "histogram", "labels": ["route"]},
}


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (group) (max by (group, topic, partition) (stocksvr_consumer_group_lag{group=~"$group"}))',
     ["stocksvr_consumer_group_lag"]),
    ("histogram_quantile(0.99, sum by (operation, le) "
     "(rate(stocksvr_reservation_operation_seconds_bucket[$__rate_interval])))",
     ["stocksvr_reservation_operation_seconds_bucket"]),
    ("clamp_max(a_total / clamp_min(sum(rate(b_total[5m])), 1e-9), 86400) or vector(0)", ["a_total", "b_total"]),
    ("x > 0 and on (group) changes(y[10m]) == 0 and on (group) max by (group) (z offset 10m)", ["x", "y", "z"]),
    ('time() - max(m2_seconds) > 1800 and up{job="s"} == 0 unless m55', ["m2_seconds", "up", "m55"]),
    ("max(deriv(q[2m:30s])) * 60 > 100 and count(r) by (kind)", ["q", "r"]),
])
def test_metric_names_are_the_selected_series_only(expr, names):
    assert obslib.metric_names(expr) == names


def test_substitute_replaces_all_values_and_grafana_intervals():
    variables = {"group": {"name": "group", "type": "query", "allValue": ".*"}}
    got = obslib.substitute('rate(x{group=~"$group",g=~"${group}"}[$__rate_interval])', variables)
    assert got == 'rate(x{group=~".*",g=~".*"}[1m])'


def test_substitute_refuses_an_undeclared_variable():
    with pytest.raises(KeyError):
        obslib.substitute("x{a=~\"$nope\"}", {})


@pytest.mark.parametrize(("expr", "want_problems", "want_labels"), [
    ('sum by (processor, class) (rate(a_total{class="invalid"}[5m]))', [], {"processor", "class"}),
    ("sum by (topic) (rate(a_total[5m]))", ["no label 'topic'"], {"topic"}),
    ('rate(a_total{class=~"invalid|retries-exhausted"}[5m])', ["'retries-exhausted'"],
     {"processor", "class", "instance", "job"}),
    ('a_total{route="x"}', ["has no label 'route'"], None),
    ("histogram_quantile(0.99, sum by (route) (rate(h_seconds_bucket[1m])))", ["without an 'le'"], {"route"}),
    ("histogram_quantile(0.99, sum by (route, le) (rate(h_seconds_bucket[1m])))", [], {"route"}),
    ("count(g == 0) or vector(0)", [], set()),
    ("time() - max(g) > 1800 and max(g) > 0", [], set()),
    ("max by (group) (g) > 0 and on (group, topic) max by (group) (g offset 10m)",
     ["left side of 'and' carries no 'topic'", "right side"], {"group"}),
    ("topk(5, max by (group, topic) (g))", [], {"group", "topic"}),
    ("max(deriv(g[2m:30s])) * 60 > 100", [], set()),
    ("-sum(a_total) / clamp_min(sum(rate(a_total[5m])), 1e-9)", [], set()),
    ("sum(g) by (group)", [], {"group"}),
    ("max without (instance) (g)", [], {"group", "topic", "job"}),
    ("sum by (", ["cannot parse"], None),
])
def test_check_finds_label_mistakes_and_infers_result_labels(expr, want_problems, want_labels):
    problems, labels = promql.check(expr, CATALOG)
    assert len(problems) == len(want_problems), problems
    for want in want_problems:
        assert any(want in p for p in problems), (want, problems)
    if want_labels is not None:
        assert labels == want_labels


@pytest.mark.parametrize(("series", "n_problems"), [
    ('a_total{instance="a",class="retries-exhausted"}', 1),
    ('g{job="s",instance="a",group="x",topic="t"}', 0),
    ('g{partition="0"}', 1),
    ("not_in_catalog", 1),
])
def test_series_problems_hold_promtool_inputs_to_the_catalog(series, n_problems):
    assert len(promql.series_problems(series, CATALOG)) == n_problems
