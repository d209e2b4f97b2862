#!/usr/bin/env python3
"""Lint of grafana/dashboards/*.json (no Grafana needed).

Checks, per dashboard: a unique uid and title; unique panel ids; every panel (rows aside) has
a unit, a title and at least one target; every panel, target and query variable uses the
provisioned datasource (uid `prometheus`) or the `$datasource` variable; every target has an
expression and a unique refId; every template variable an expression uses is declared; every
metric an expression names is in prometheus/metrics-catalog.json; and against the catalog's
labels (promql.py): every matcher, `by (...)` and `on (...)` names a label the series carry,
every matched value a metric declares is one of its values, every `{{label}}` of a legend is a
label of the query's result. Across dashboards: the provisioning files point at the same
datasource uid and folder.

    python3 tests/observability/lint_dashboards.py

Its PromQL helpers are unit-tested in test_promql.py (tests/lint.sh).

Exit 0 when clean, 1 with one line per problem. Standard library only.
"""

import argparse
import re
import sys

import obslib
import promql


def lint_dashboard(name, dash, catalog_series, catalog):
    problems = []

    def bad(where, what):
        problems.append(f"{name}: {where}: {what}")

    for key in ("uid", "title"):
        if not dash.get(key):
            bad("dashboard", f"no {key}")
    variables = obslib.variables_of(dash)
    for var in variables.values():
        if var.get("type") == "query":
            check_datasource(var.get("datasource"), f"variable ${var['name']}", bad)
            query = var.get("query")
            text = query.get("query", "") if isinstance(query, dict) else (query or "")
            if not text:
                bad(f"variable ${var['name']}", "no query")
            for metric in obslib.metric_names(strip_label_values(text)):
                if metric not in catalog_series:
                    bad(f"variable ${var['name']}", f"metric {metric} is not in the catalog")
            m = re.match(r"\s*label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*$", text)
            if m:
                labels = promql.metric_labels(m.group(1), catalog)
                if labels is not None and m.group(2) not in labels:
                    bad(f"variable ${var['name']}", f"{m.group(1)} has no label {m.group(2)!r}")
        if (var.get("multi") or var.get("includeAll")) and var.get("allValue") not in (None, ".*", ".+"):
            bad(f"variable ${var['name']}", "All must mean .* (check_queries relies on it)")

    seen_ids = {}
    for panel in obslib.all_panels(dash):
        pid = panel.get("id")
        where = f"panel {pid} {panel.get('title', '')!r}"
        if pid is None:
            bad(where, "no id")
        elif pid in seen_ids:
            bad(where, f"id also used by {seen_ids[pid]!r}")
        else:
            seen_ids[pid] = panel.get("title", "")
        if panel.get("type") == "row":
            continue
        if not panel.get("title"):
            bad(where, "no title")
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        if not unit:
            bad(where, "no unit (fieldConfig.defaults.unit)")
        check_datasource(panel.get("datasource"), where, bad)
        targets = panel.get("targets") or []
        if not targets:
            bad(where, "no targets")
        refs = set()
        for target in targets:
            ref = target.get("refId")
            twhere = f"{where} target {ref}"
            if not ref or ref in refs:
                bad(twhere, "missing or repeated refId")
            refs.add(ref)
            if "datasource" in target:
                check_datasource(target["datasource"], twhere, bad)
            expr = (target.get("expr") or "").strip()
            if not expr:
                bad(twhere, "no expression")
                continue
            for var in re.findall(r"\$\{?(\w+)", expr):
                if var not in variables and var not in obslib.BUILTIN_VARIABLES:
                    bad(twhere, f"uses undeclared variable ${var}")
            for m in re.finditer(r'(\w+)\s*(=|!=)\s*"\$\{?(\w+)', expr):
                if m.group(3) in variables:
                    bad(twhere, f"variable ${m.group(3)} must be matched with =~ (multi-value)")
            for metric in obslib.metric_names(expr):
                if metric not in catalog_series:
                    bad(twhere, f"metric {metric} is not in the catalog")
            try:
                substituted = obslib.substitute(expr, variables)
            except KeyError:
                continue  # reported above as an undeclared variable
            found, labels = promql.check(substituted, catalog)
            for problem in found:
                bad(twhere, problem)
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")):
                if labels is not None and label not in labels:
                    bad(twhere, f"legend uses {{{{{label}}}}} but the result carries only "
                                f"{', '.join(sorted(labels)) or 'no labels'}")
    return problems


def strip_label_values(query):
    """label_values(metric, label) -> metric; label_values(label) -> ''."""
    m = re.match(r"\s*label_values\(\s*([^,)]*?)\s*(?:,\s*\w+\s*)?\)\s*$", query)
    if m:
        inner = m.group(1)
        return inner if "," in query else ""
    return query


def check_datasource(ds, where, bad):
    if ds is None:
        bad(where, "no datasource (the default datasource is not pinned)")
        return
    uid = ds.get("uid") if isinstance(ds, dict) else ds
    if uid not in obslib.DATASOURCE_REFS:
        bad(where, f"datasource {uid!r} is neither uid {obslib.DATASOURCE_UID!r} nor $datasource")
    if isinstance(ds, dict) and ds.get("type") not in (None, "prometheus"):
        bad(where, f"datasource type {ds.get('type')!r} is not prometheus")


def lint_provisioning():
    problems = []
    base = obslib.REPO / "grafana" / "provisioning"
    ds = (base / "datasources" / "prometheus.yml").read_text()
    if not re.search(rf"^\s*uid:\s*{obslib.DATASOURCE_UID}\s*$", ds, re.M):
        problems.append(f"grafana/provisioning/datasources/prometheus.yml: uid is not "
                        f"{obslib.DATASOURCE_UID}")
    boards = (base / "dashboards" / "stocksvr.yml").read_text()
    if "/var/lib/grafana/dashboards" not in boards:
        problems.append("grafana/provisioning/dashboards/stocksvr.yml: does not load "
                        "/var/lib/grafana/dashboards")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dashboards", default=str(obslib.DASHBOARDS),
                        help="directory of dashboard JSON files (default: grafana/dashboards)")
    args = parser.parse_args()

    catalog = obslib.load_catalog()
    catalog_series = obslib.series_names(catalog)
    dashboards = obslib.load_dashboards(obslib.Path(args.dashboards))
    problems = []
    if not dashboards:
        problems.append("no dashboards in grafana/dashboards/")
    uids, titles = {}, {}
    panels = targets = 0
    for name, dash in dashboards:
        problems += lint_dashboard(name, dash, catalog_series, catalog)
        for key, seen in (("uid", uids), ("title", titles)):
            value = dash.get(key)
            if value in seen:
                problems.append(f"{name}: {key} {value!r} also used by {seen[value]}")
            seen[value] = name
        for panel in obslib.all_panels(dash):
            if panel.get("type") != "row":
                panels += 1
                targets += len(panel.get("targets") or [])
    problems += lint_provisioning()
    for p in problems:
        print(p)
    print(f"lint_dashboards: {len(dashboards)} dashboards, {panels} panels, {targets} queries, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
