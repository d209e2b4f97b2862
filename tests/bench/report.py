"""The bench's output: one table of figures and ratios on stdout, figures.csv, phases.csv
(what each process used during each phase) and sweep.png (throughput and p99 against
concurrency)."""

import csv
import os

FIELDS = ["key", "label", "value", "unit", "p50_ms", "p99_ms", "concurrency", "note"]


class Figures:
    def __init__(self):
        self.rows = []
        self.ratios = []  # (label, value, note)

    def add(self, key, label, value, unit="/s", p50_ms=None, p99_ms=None, concurrency=None, note=""):
        self.rows.append(dict(key=key, label=label, value=value, unit=unit, p50_ms=p50_ms,
                              p99_ms=p99_ms, concurrency=concurrency, note=note))

    def get(self, key):
        for r in self.rows:
            if r["key"] == key:
                return r["value"]
        return None

    def ratio(self, key, label, num, den, note=""):
        a, b = self.get(num), self.get(den)
        self.ratio_value(key, label, a / b if a is not None and b else None, note)

    def ratio_value(self, key, label, value, note=""):
        self.ratios.append((label, value, note))
        self.rows.append(dict(key=key, label=label, value=value, unit="ratio", p50_ms=None,
                              p99_ms=None, concurrency=None, note=note))


def _fmt(v, unit=""):
    if v is None:
        return "-"
    if unit == "ratio":
        return f"{v:.2f}x"
    if isinstance(v, float):
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.2f}"
    return f"{v:,}"


def table(fig, header, phases_lines, durability, took):
    out = [header, ""]
    w = max((len(r["label"]) for r in fig.rows if r["unit"] != "ratio"), default=40) + 2
    out.append(f"{'workload':<{w}}{'value':>12}  {'unit':<8}{'p50 ms':>9}{'p99 ms':>9}  note")
    for r in fig.rows:
        if r["unit"] == "ratio":
            continue
        out.append(f"{r['label']:<{w}}{_fmt(r['value']):>12}  {r['unit']:<8}"
                   f"{_fmt(r['p50_ms']):>9}{_fmt(r['p99_ms']):>9}  {r['note']}")
    out.append("")
    out.append("ratios (same run)")
    for label, value, note in fig.ratios:
        out.append(f"  {label:<{w - 2}}{_fmt(value, 'ratio'):>12}  {note}")
    out.append("")
    out.append("what each process used (CPU in % of one core; the machine has "
               f"{os.cpu_count()} cores; RSS max)")
    out.extend("  " + x for x in phases_lines)
    out.append("")
    out.append("durability after the load")
    out.extend("  " + x for x in durability)
    out.append("")
    out.append(took)
    return "\n".join(out)


def write_csv(path, fig):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in fig.rows:
            w.writerow({k: ("" if r[k] is None else (round(r[k], 4) if isinstance(r[k], float) else r[k]))
                        for k in FIELDS})


def write_phases_csv(path, phases):
    procs = sorted({p for ph in phases for p in ph["usage"].get("procs", {})})
    mysql_keys = sorted({k for ph in phases for k in ph["mysql"]})
    cols = (["phase", "seconds"] + [f"cpu_pct:{p}" for p in procs] + [f"rss_max_mb:{p}" for p in procs]
            + ["machine_user_pct", "machine_system_pct", "machine_softirq_pct", "machine_idle_pct"]
            + [f"mysql_per_s:{k}" for k in mysql_keys] + ["redis_evalsha_per_s", "redis_cpu_pct"])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for ph in phases:
            secs = ph["t1"] - ph["t0"]
            u = ph["usage"]
            row = [ph["name"], round(secs, 2)]
            row += [_r(u["procs"].get(p, {}).get("cpu_pct")) for p in procs]
            row += [_r(u["procs"].get(p, {}).get("rss_max_mb")) for p in procs]
            m = u.get("machine", {})
            row += [_r(m.get("user")), _r(m.get("system")), _r(m.get("softirq")), _r(m.get("idle"))]
            row += [_r(ph["mysql"].get(k, 0) / secs if secs else None) for k in mysql_keys]
            row += [_r(ph["redis"].get("evalsha", 0) / secs if secs else None),
                    _r(ph["redis"].get("cpu_s", 0) / secs * 100 if secs else None)]
            w.writerow(row)


def _r(v):
    return "" if v is None else round(v, 2)


def plot(path, sweep, baselines, title):
    """sweep: [(concurrency, rate, p99_ms)]; baselines: {label: rate} drawn as lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [c for c, _, _ in sweep]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
    a.plot(xs, [r for _, r, _ in sweep], "o-", label="Try through HTTP, hot dish")
    styles = iter(["--", ":", "-."])
    for label, value in baselines.items():
        if value:
            a.axhline(value, linestyle=next(styles, "--"), color="gray", label=label)
    a.set_xscale("log", base=2)
    a.set_xticks(xs, [str(x) for x in xs])
    a.set_xlabel("concurrent connections")
    a.set_ylabel("Trys per second")
    a.set_title("throughput")
    a.grid(True, alpha=0.3)
    a.legend(fontsize=8)
    b.plot(xs, [p for _, _, p in sweep], "o-", color="tab:red", label="p99")
    b.axhline(25, linestyle="--", color="gray", label="p99 goal 25 ms")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xticks(xs, [str(x) for x in xs])
    b.set_xlabel("concurrent connections")
    b.set_ylabel("p99 latency (ms)")
    b.set_title("p99 latency")
    b.grid(True, alpha=0.3)
    b.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
