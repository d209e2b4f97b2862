"""Shared helpers of the observability checks: the metric catalog, the dashboards and rules as
data, metric names named by a PromQL expression, and Grafana variable substitution.

Standard library only, so the lint runs before (and without) the virtualenv.
"""

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "prometheus" / "metrics-catalog.json"
DASHBOARDS = REPO / "grafana" / "dashboards"
RULES = REPO / "prometheus" / "rules"
RUNBOOK = REPO / "docs" / "runbook.md"

# The provisioned datasource (grafana/provisioning/datasources/prometheus.yml) and the
# variable forms a panel may use instead of it.
DATASOURCE_UID = "prometheus"
DATASOURCE_REFS = {DATASOURCE_UID, "$datasource", "${datasource}"}

# Series Prometheus itself attaches to every target; rules may use them.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}

# Grafana's built-in interval variables, replaced by what Grafana would pick for a 5 s scrape
# interval over the default one-hour range ($__rate_interval >= 4 x scrape interval).
BUILTIN_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
}

_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan", "atan2", "start", "end",
}


def load_catalog(path=CATALOG):
    """name -> metric entry of prometheus/metrics-catalog.json."""
    with open(path) as f:
        return {m["name"]: m for m in json.load(f)["metrics"]}


def series_names(catalog):
    """Every series name the catalog's metrics expose (histograms: _bucket, _sum, _count)."""
    names = {}
    for name, m in catalog.items():
        if m["type"] == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[name + suffix] = name
        else:
            names[name] = name
    return names


def load_dashboards(directory=DASHBOARDS):
    """[(file name, dashboard JSON)] sorted by file name."""
    return [(p.name, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


def all_panels(dashboard):
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", []) or []


def metric_names(expr):
    """Metric names a PromQL expression selects (not functions, keywords, labels or numbers).

    Good enough for the expressions we write: strings, label matchers, grouping clauses and
    range/subquery brackets are removed first; every identifier left that is not followed by
    `(` is a metric name. check_queries.py cross-checks against the live server.
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"'(?:[^'\\]|\\.)*'", "''", s)
    s = re.sub(r"\$\{?\w+(?::\w+)?\}?", " ", s)  # template variables
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    # Grouping clauses go entirely, so `sum by (x) (` reads as the call `sum (`.
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\boffset\s+-?[0-9]+[smhdwy]\b", " ", s)
    s = re.sub(r"(?<![A-Za-z0-9_:])[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?", " ", s)
    names = []
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("("):
            continue  # function (or aggregation) call
        if word.lower() in _KEYWORDS:
            continue
        if word not in names:
            names.append(word)
    return names


def variables_of(dashboard):
    return {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}


def substitute(expr, variables):
    """Replaces $var / ${var} / [[var]] by what the check should run: a variable's All value
    (`.*`, only valid inside =~ matchers), Grafana's interval variables by fixed durations."""
    def value(name):
        if name in BUILTIN_VARIABLES:
            return BUILTIN_VARIABLES[name]
        v = variables.get(name)
        if v is None:
            raise KeyError(f"unknown template variable ${name}")
        if v.get("type") == "datasource":
            return DATASOURCE_UID
        return v.get("allValue") or ".*"

    expr = re.sub(r"\$\{(\w+)(?::\w+)?\}", lambda m: value(m.group(1)), expr)
    expr = re.sub(r"\[\[(\w+)\]\]", lambda m: value(m.group(1)), expr)
    return re.sub(r"\$(\w+)", lambda m: value(m.group(1)), expr)


def load_rules(directory=RULES):
    """[(file name, group name, rule)] of every rule file."""
    import yaml  # only the rule checks need PyYAML (from the virtualenv)

    out = []
    for path in sorted(directory.glob("*.yml")):
        for group in yaml.safe_load(path.read_text()).get("groups", []):
            for rule in group.get("rules", []):
                out.append((path.name, group["name"], rule))
    return out


def github_anchor(heading):
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces
    to dashes."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def runbook_anchors(path=RUNBOOK):
    anchors = set()
    if not path.exists():
        return anchors
    for line in path.read_text().splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            anchors.add(github_anchor(m.group(1)))
    return anchors
