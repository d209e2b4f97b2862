#!/usr/bin/env python3
"""Lint of prometheus/rules/*.yml beyond what promtool checks.

Every alert: a unique name, severity critical or warning, the annotations summary, description
and runbook, a runbook link to an existing section of docs/runbook.md, only metrics from
prometheus/metrics-catalog.json (or Prometheus' own `up`) with the labels and label values the
catalog gives them (promql.py), `$labels.x` in annotations only for labels the expression's
result carries, and in prometheus/tests/*.yml at least one case where it fires and one where
it stays quiet, whose input series carry only catalog labels and values (a case built on
labels stocksvr never exports proves nothing). Every catalog metric is shown on a dashboard
or used by a rule.

    tests/observability/lint_rules.py      (needs PyYAML: run with the observability venv)
"""

import re
import sys

import yaml

import obslib
import promql

SEVERITIES = {"critical", "warning"}
ANNOTATIONS = ("summary", "description", "runbook")


def rule_tests(catalog, problems):
    """alertname -> [number of firing cases, number of quiet cases]; input series that do
    not match the catalog go to `problems`."""
    cases = {}
    for path in sorted((obslib.REPO / "prometheus" / "tests").glob("*.yml")):
        for test in yaml.safe_load(path.read_text()).get("tests", []):
            for series in test.get("input_series", []) or []:
                for problem in promql.series_problems(series["series"], catalog):
                    problems.append(f"prometheus/tests/{path.name} {test.get('name')!r}: "
                                    f"{problem}")
            for case in test.get("alert_rule_test", []) or []:
                counts = cases.setdefault(case["alertname"], [0, 0])
                counts[0 if case.get("exp_alerts") else 1] += 1
    return cases


def main():
    catalog = obslib.load_catalog()
    catalog_series = obslib.series_names(catalog)
    anchors = obslib.runbook_anchors()
    problems = []
    tests = rule_tests(catalog, problems)
    seen = {}
    alerts = 0
    for file, group, rule in obslib.load_rules():
        name = rule.get("alert") or rule.get("record")
        where = f"{file} {group} {name}"
        for metric in obslib.metric_names(rule.get("expr", "")):
            if metric not in catalog_series and metric not in obslib.PROMETHEUS_SERIES:
                problems.append(f"{where}: metric {metric} is not in the catalog")
        found, labels = promql.check(rule.get("expr", ""), catalog)
        problems += [f"{where}: {p}" for p in found]
        if "alert" not in rule:
            continue
        if labels is not None:
            labels |= set(rule.get("labels") or {})
            for text in (rule.get("annotations") or {}).values():
                for label in re.findall(r"\$labels\.(\w+)", str(text)):
                    if label not in labels:
                        problems.append(f"{where}: annotation uses $labels.{label}, which the "
                                        f"expression's result does not carry")
        alerts += 1
        if name in seen:
            problems.append(f"{where}: alert name also used in {seen[name]}")
        seen[name] = where
        severity = (rule.get("labels") or {}).get("severity")
        if severity not in SEVERITIES:
            problems.append(f"{where}: severity {severity!r} is not one of {sorted(SEVERITIES)}")
        annotations = rule.get("annotations") or {}
        for key in ANNOTATIONS:
            if not str(annotations.get(key, "")).strip():
                problems.append(f"{where}: no {key} annotation")
        runbook = str(annotations.get("runbook", ""))
        path, _, anchor = runbook.partition("#")
        if path != "docs/runbook.md" or not anchor:
            problems.append(f"{where}: runbook {runbook!r} is not docs/runbook.md#<section>")
        elif anchor not in anchors:
            problems.append(f"{where}: docs/runbook.md has no section #{anchor}")
        elif anchor != obslib.github_anchor(name):
            problems.append(f"{where}: runbook section #{anchor} is not named after the alert")
        firing, quiet = tests.get(name, [0, 0])
        if not firing:
            problems.append(f"{where}: no promtool case in which it fires")
        if not quiet:
            problems.append(f"{where}: no promtool case in which it stays quiet")
    # Every catalog metric is shown somewhere: on a dashboard or in an alert.
    shown = set()
    for _file, _, rule in obslib.load_rules():
        shown |= {catalog_series[m] for m in obslib.metric_names(rule.get("expr", ""))
                  if m in catalog_series}
    for _, dash in obslib.load_dashboards():
        for var in obslib.variables_of(dash).values():
            query = var.get("query")
            text = query.get("query", "") if isinstance(query, dict) else (query or "")
            inner = text.replace("label_values(", "").split(",")[0]
            shown |= {catalog_series[m] for m in obslib.metric_names(inner)
                      if m in catalog_series}
        for panel in obslib.all_panels(dash):
            for target in panel.get("targets", []) or []:
                shown |= {catalog_series[m] for m in obslib.metric_names(target.get("expr", ""))
                          if m in catalog_series}
    for name in sorted(set(catalog_series.values()) - shown):
        problems.append(f"metrics-catalog.json: {name} is on no dashboard and in no rule")
    for name in sorted(set(tests) - set(seen)):
        problems.append(f"prometheus/tests: cases for {name}, which no rule defines")
    for p in problems:
        print(p)
    print(f"lint_rules: {alerts} alerts, {sum(sum(c) for c in tests.values())} promtool "
          f"cases, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
