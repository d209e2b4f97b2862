"""check_queries.check against a fake Prometheus: what passes, what fails, what is skipped,
and that an empty query is retried until it has data or the wait is over."""

import check_queries

DASHBOARD = ("d.json", {"templating": {"list": [{"name": "group", "type": "query", "allValue": ".*",
                                                  "query": "label_values(lag_total, group)"}]},
                        "panels": [{"title": "lag", "targets": [{"refId": "A", "expr": 'sum(lag_total{group=~"$group"})'}]},
                                   {"title": "new", "targets": [{"refId": "A", "expr": "rate(new_total[1m])"}]},
                                   {"title": "gone", "targets": [{"refId": "A", "expr": "sum(gone_total)"}]}]})
CATALOG = {"lag_total": {"type": "counter"}, "new_total": {"type": "counter", "not_emitted_yet": "issue 99"},
           "gone_total": {"type": "counter"}}


class FakeProm:
    def __init__(self, present, series_after=None):
        self.have = set(present)
        self.series_after = series_after or {}  # expr -> series count from the n-th query on
        self.calls = {}

    def format_query(self, expr):
        return None

    def query(self, expr):
        self.calls[expr] = self.calls.get(expr, 0) + 1
        first, n = self.series_after.get(expr, (1, 1))
        return (n if self.calls[expr] >= first else 0), None

    def present(self, metric):
        return metric in self.have

    def forget_absent(self):
        pass

    def label_values(self, label, metric):
        return ["g1"] if metric in self.have else []


def by_panel(results):
    return {r["panel"]: r["status"] for r in results}


def test_queries_with_data_pass_missing_metrics_fail_and_not_emitted_yet_is_skipped():
    prom = FakeProm({"lag_total"}, series_after={"rate(new_total[1m])": (99, 1)})  # no data yet
    got = by_panel(check_queries.check(prom, [DASHBOARD], wait=0, catalog=CATALOG))
    assert got["$group"] == "ok"
    assert got["lag"] == "ok"
    assert got["gone"] == "missing metric gone_total"
    assert got["new"].startswith("skipped: not emitted yet: new_total (issue 99)")


def test_an_empty_query_is_retried_until_it_has_data(monkeypatch):
    monkeypatch.setattr("stocksvr_harness.wait.time.sleep", lambda s: None)
    expr = 'sum(lag_total{group=~".*"})'
    prom = FakeProm({"lag_total", "gone_total", "new_total"}, series_after={expr: (3, 2)})
    got = by_panel(check_queries.check(prom, [DASHBOARD], wait=60, catalog=CATALOG))
    assert got["lag"] == "ok"
    assert prom.calls[expr] == 3


def test_an_empty_query_fails_once_the_wait_is_over():
    expr = 'sum(lag_total{group=~".*"})'
    prom = FakeProm({"lag_total", "gone_total", "new_total"}, series_after={expr: (99, 1)})
    got = by_panel(check_queries.check(prom, [DASHBOARD], wait=0, catalog=CATALOG))
    assert got["lag"] == "empty"
