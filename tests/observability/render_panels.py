#!/usr/bin/env python3
"""Draws the key dashboard panels from a real run into one PNG (no Grafana needed).

Each panel's queries go through Prometheus' /api/v1/query_range over the run's time span,
with the template variables substituted as check_queries.py does; phases of the run
(healthy, a consumer gone, recovered) are shaded so a reader sees what each looks like.

    render_panels.py --prometheus URL --start UNIX --end UNIX \\
        [--phase START:END:LABEL ...] [--out docs/observability/key-panels.png]

tests/observability/live.sh --render runs the scenario and calls this. Needs matplotlib and
requests (observability venv).
"""

import argparse
import re
import sys
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import requests

import obslib

# (dashboard file, panel title): what an on-call looks at first.
KEY_PANELS = [
    ("stocksvr-overview.json", "Lag per group (seconds)"),
    ("stocksvr-overview.json", "Lag per group (records)"),
    ("stocksvr-pipeline.json", "Members"),
    ("stocksvr-overview.json", "Reservation operations"),
    ("stocksvr-overview.json", "Service latency p50 / p99"),
    ("stocksvr-overview.json", "Outbox backlog"),
]
PHASE_COLOURS = ["#e8f5e9", "#ffebee", "#e3f2fd", "#fff8e1"]


def find_panel(dashboards, file, title):
    for name, dash in dashboards:
        if name != file:
            continue
        for panel in obslib.all_panels(dash):
            if panel.get("title") == title:
                return panel, obslib.variables_of(dash)
    raise SystemExit(f"no panel {title!r} in {file}")


def legend(fmt, labels, fallback):
    if not fmt:
        return fallback
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def query_range(url, expr, start, end, step):
    resp = requests.get(f"{url.rstrip('/')}/api/v1/query_range",
                        params={"query": expr, "start": start, "end": end, "step": step},
                        timeout=60)
    body = resp.json()
    if body.get("status") != "success":
        raise RuntimeError(body.get("error", "query_range failed"))
    return body["data"]["result"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--start", type=float, required=True)
    parser.add_argument("--end", type=float, required=True)
    parser.add_argument("--step", type=float, default=5)
    parser.add_argument("--phase", action="append", default=[],
                        help="START:END:LABEL in unix seconds, shaded on every panel")
    parser.add_argument("--title", default="stocksvr key panels (from a real run)")
    parser.add_argument("--out", default=str(obslib.REPO / "docs" / "observability"
                                             / "key-panels.png"))
    args = parser.parse_args()

    dashboards = obslib.load_dashboards()
    phases = []
    for spec in args.phase:
        start, end, label = spec.split(":", 2)
        phases.append((float(start), float(end), label))

    cols = 2
    rows = (len(KEY_PANELS) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(15, 4.2 * rows), squeeze=False)
    empty = []
    for ax, (file, title) in zip(axes.flat, KEY_PANELS, strict=False):
        panel, variables = find_panel(dashboards, file, title)
        unit = panel["fieldConfig"]["defaults"].get("unit", "")
        drawn = 0
        for target in panel["targets"]:
            expr = obslib.substitute(target["expr"], variables)
            for series in query_range(args.prometheus, expr, args.start, args.end, args.step):
                xs, ys, last = [], [], None
                for t, v in series["values"]:
                    t = float(t)
                    # A scrape gap (the process was down) is a gap, not a straight line.
                    if last is not None and t - last > 2.5 * args.step:
                        xs.append(datetime.fromtimestamp(last + args.step, timezone.utc))
                        ys.append(float("nan"))
                    last = t
                    xs.append(datetime.fromtimestamp(t, timezone.utc))
                    ys.append(float(v) if v not in ("+Inf", "-Inf") else float("nan"))
                if not xs:
                    continue
                ax.plot(xs, ys, linewidth=1.3,
                        label=legend(target.get("legendFormat"), series["metric"],
                                     target["refId"]))
                drawn += 1
        for i, (start, end, label) in enumerate(phases):
            ax.axvspan(datetime.fromtimestamp(start, timezone.utc),
                       datetime.fromtimestamp(end, timezone.utc),
                       color=PHASE_COLOURS[i % len(PHASE_COLOURS)], zorder=0,
                       label=f"phase: {label}" if ax is axes.flat[0] else None)
        ax.set_title(f"{title}  [{unit}]", fontsize=11)
        ax.set_xlim(datetime.fromtimestamp(args.start, timezone.utc),
                    datetime.fromtimestamp(args.end, timezone.utc))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
        ax.grid(True, alpha=0.3)
        if drawn:
            ax.legend(fontsize=7, loc="best", ncol=2, framealpha=0.7)
        else:
            empty.append(title)
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center",
                    va="center", fontsize=14, color="grey")
    for ax in list(axes.flat)[len(KEY_PANELS):]:
        ax.axis("off")
    fig.suptitle(args.title + " — UTC", fontsize=13)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print(f"render_panels: wrote {args.out} ({len(KEY_PANELS)} panels, "
          f"{len(empty)} without data{': ' + ', '.join(empty) if empty else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
