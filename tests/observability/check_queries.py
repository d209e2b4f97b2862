#!/usr/bin/env python3
"""Runs every dashboard query against a live Prometheus that scrapes a running stocksvr.

For every target of every panel: substitute the template variables (All = `.*`, Grafana's
interval variables by fixed durations), check the syntax with /api/v1/format_query, run it
with /api/v1/query and require at least one series; and for every metric the expression
names, require that Prometheus has it at all (so `... or vector(0)` cannot hide a metric
stocksvr does not export). Query variables (label_values) must return values. A query that
comes back empty only because it names a metric the catalog marks `not_emitted_yet` (declared,
no code emits it yet) is reported as skipped, not failed; once the metric is emitted, the
catalog drops the mark and the query must return data like any other.

    check_queries.py --prometheus http://127.0.0.1:9090 [--report out.json] [--wait 60]

`--wait` retries the empty queries for that many seconds (rates need two scrapes). Prints one
line per query and a summary; exits 1 when any query fails. Needs `requests` (observability
venv).
"""

import argparse
import json
import os
import re
import sys
import time

import requests

import obslib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from stocksvr_harness.wait import WaitTimeout, wait_until


class Prometheus:
    def __init__(self, url):
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self._present = {}

    def get(self, path, **params):
        resp = self.session.get(f"{self.url}{path}", params=params, timeout=30)
        try:
            body = resp.json()
        except ValueError:
            return {"status": "error", "error": f"HTTP {resp.status_code}: {resp.text[:200]}"}
        return body

    def format_query(self, expr):
        body = self.get("/api/v1/format_query", query=expr)
        if body.get("status") == "success":
            return None
        return body.get("error", "format_query failed")

    def query(self, expr):
        body = self.get("/api/v1/query", query=expr)
        if body.get("status") != "success":
            return None, body.get("error", "query failed")
        data = body["data"]
        if data["resultType"] in ("scalar", "string"):
            return 1, None
        return len(data["result"]), None

    def present(self, metric):
        """Whether Prometheus holds any series of `metric` in the last hour."""
        if metric not in self._present:
            end = time.time()
            body = self.get("/api/v1/series", **{"match[]": metric, "start": end - 3600,
                                                 "end": end})
            self._present[metric] = bool(body.get("status") == "success" and body["data"])
        return self._present[metric]

    def forget_absent(self):
        """Asks again next time for metrics that were absent (a retry may find them)."""
        self._present = {m: True for m, here in self._present.items() if here}

    def label_values(self, label, metric):
        params = {"match[]": metric} if metric else {}
        body = self.get(f"/api/v1/label/{label}/values", **params)
        return body.get("data", []) if body.get("status") == "success" else []


def items(dashboards):
    """(dashboard file, panel title, refId, expression, variables) of every target."""
    for name, dash in dashboards:
        variables = obslib.variables_of(dash)
        for panel in obslib.all_panels(dash):
            for target in panel.get("targets", []) or []:
                yield name, panel.get("title", ""), target.get("refId", "?"), \
                    target.get("expr", ""), variables


def catalog_name(metric, catalog):
    """The catalog metric a series name belongs to (histograms: _bucket, _sum, _count)."""
    if metric in catalog:
        return metric
    for suffix in ("_bucket", "_sum", "_count"):
        if metric.endswith(suffix) and metric[: -len(suffix)] in catalog:
            return metric[: -len(suffix)]
    return metric


def check(prom, dashboards, wait, catalog=None):
    catalog = catalog or {}
    not_yet = {name: m["not_emitted_yet"] for name, m in catalog.items()
               if m.get("not_emitted_yet")}
    results = []
    for name, dash in dashboards:
        for var in obslib.variables_of(dash).values():
            if var.get("type") != "query":
                continue
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            m = re.match(r"\s*label_values\(\s*(?:([^,]+?)\s*,\s*)?(\w+)\s*\)\s*$", query)
            if not m:
                results.append({"dashboard": name, "panel": f"${var['name']}", "ref": "var",
                                "expr": query, "status": "unsupported variable query"})
                continue
            values = prom.label_values(m.group(2), m.group(1))
            results.append({"dashboard": name, "panel": f"${var['name']}", "ref": "var",
                            "expr": query, "series": len(values),
                            "status": "ok" if values else "empty"})

    pending = []
    for name, title, ref, expr, variables in items(dashboards):
        entry = {"dashboard": name, "panel": title, "ref": ref, "expr": expr}
        results.append(entry)
        try:
            entry["query"] = obslib.substitute(expr, variables)
        except KeyError as e:
            entry["status"] = f"variable: {e}"
            continue
        error = prom.format_query(entry["query"])
        if error:
            entry["status"] = f"syntax: {error}"
            continue
        pending.append(entry)

    def round_done():
        """One pass over the queries still pending; true when none came back empty."""
        retry = []
        for entry in pending:
            missing = [m for m in obslib.metric_names(entry["expr"]) if not prom.present(m)]
            waiting = sorted({catalog_name(m, catalog) for m in missing} & not_yet.keys())
            missing = [m for m in missing if catalog_name(m, catalog) not in not_yet]
            count, error = prom.query(entry["query"])
            entry["series"] = count or 0
            if error:
                entry["status"] = f"query: {error}"
            elif missing:
                entry["status"] = "missing metric " + ", ".join(missing)
            elif waiting and not count:
                entry["status"] = "skipped: not emitted yet: " + ", ".join(
                    f"{m} ({not_yet[m]})" for m in waiting)
            elif not count:
                entry["status"] = "empty"
                retry.append(entry)
            else:
                entry["status"] = "ok"
        if not retry:
            return True
        prom.forget_absent()
        pending[:] = retry
        return False

    try:
        wait_until(round_done, wait, "every dashboard query to return a series", interval=5)
    except WaitTimeout:
        pass  # the queries still empty are reported as such
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="base URL of Prometheus")
    parser.add_argument("--dashboards", default=str(obslib.DASHBOARDS))
    parser.add_argument("--report", help="write every result as JSON to this file")
    parser.add_argument("--wait", type=float, default=0,
                        help="seconds to keep retrying queries that return nothing")
    args = parser.parse_args()

    prom = Prometheus(args.prometheus)
    dashboards = obslib.load_dashboards(obslib.Path(args.dashboards))
    catalog = obslib.load_catalog()
    results = check(prom, dashboards, args.wait, catalog)
    absent = sorted(
        name for name, m in catalog.items()
        if not prom.present(name + ("_count" if m["type"] == "histogram" else "")))

    skipped = [r for r in results if r["status"].startswith("skipped")]
    for r in results:
        mark = "ok   " if r["status"] == "ok" else "skip " if r in skipped else "FAIL "
        print(f"{mark}{r['dashboard']} / {r['panel']} [{r['ref']}]: {r['status']} "
              f"({r.get('series', 0)} series)")
        if r["status"] != "ok":
            print(f"       {r.get('query', r['expr'])}")
    failed = [r for r in results if r["status"] != "ok" and r not in skipped]
    print(f"\ncatalog metrics Prometheus has no series of ({len(absent)} of {len(catalog)}): "
          f"{', '.join(absent) if absent else 'none'}")
    print(f"check_queries: {len(results)} queries, "
          f"{len(results) - len(failed) - len(skipped)} ok, {len(skipped)} skipped "
          f"(metric not emitted yet), {len(failed)} failed")
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"prometheus": args.prometheus, "results": results,
                       "absent_catalog_metrics": absent}, f, indent=1)
    print(f"{len(results) - len(failed) - len(skipped)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
