#!/usr/bin/env python3
"""The stocksvr Grafana dashboards as code: writes grafana/dashboards/*.json and
docs/observability/queries.md (every query as a link to the Prometheus graph page).

    python3 tests/observability/dashboards.py          # rewrite the JSON files
    python3 tests/observability/dashboards.py --check  # exit 1 if a file differs (run.sh)

Standard library only. Conventions every panel follows (lint_dashboards.py checks them on the
JSON, so a hand edit of a JSON file is caught too):

- datasource: the provisioned Prometheus with the fixed uid `prometheus`
  (grafana/provisioning/datasources/prometheus.yml);
- every panel has a unit and a description; every target an expression and a legend;
- several stocksvr instances may run the lag exporter and read the same MySQL gauges: they all
  export identical values, so panels take `max by (<the series' own labels>)` first and only
  then sum, never a plain `sum` that would count each instance again;
- template variables: `instance` (per-process figures: HTTP, service latency, processors) and
  `group` (consumer groups, from the lag exporter). Both multi-value with All = `.*`, used only
  in `=~` matchers so check_queries.py can substitute `.*`.
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "grafana" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}

# Aggregations reused by several panels (see the module doc for why `max by` comes first).
LAG = 'max by (group, topic, partition) (stocksvr_consumer_group_lag{group=~"$group"})'
LAG_SECONDS = 'max by (group, topic, partition) (stocksvr_consumer_group_lag_seconds{group=~"$group"})'
COMMIT_RATE = (
    'max by (group, topic, partition) '
    '(rate(stocksvr_consumer_group_committed_offset{group=~"$group"}[5m]))'
)
INST = 'instance=~"$instance"'
# Reservation service outcomes that are failures of stocksvr itself, from the values the
# catalog documents for stocksvr_reservation_operations_total: a dependency unavailable, a
# Redis outcome unknown, Redis and MySQL inconsistent, a bucket whose Redis key is lost. A
# REJECTED Try, an invalid request, a conflict or a Try of a failed order (order_failed) is
# an answer, not a failure.
FAILED_OUTCOMES = 'outcome=~"unavailable|unknown|inconsistent|bucket_lost"'
# The topic the time wheel emits InventoryConfirmDue on, inside any kafka.topic_namespace.
SCHEDULE_TOPIC = 'topic=~"(.+[.])?inventory[.]schedule[.]v1"'


def q(expr, legend, ref=None):
    return {"expr": expr, "legend": legend, "ref": ref}


def hist(metric, by, quantile, matchers=""):
    """histogram_quantile over a catalog histogram, per `by` label(s)."""
    labels = f"{by}, le" if by else "le"
    sel = f"{metric}_bucket{{{matchers}}}" if matchers else f"{metric}_bucket"
    return (
        f"histogram_quantile({quantile}, sum by ({labels}) "
        f"(rate({sel}[$__rate_interval])))"
    )


class Board:
    """Lays panels out left to right in rows of 24 grid units."""

    def __init__(self, uid, title, description, variables):
        self.uid, self.title, self.description = uid, title, description
        self.variables = variables
        self.panels = []
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_h = 0

    def _id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title):
        if self.x:
            self.y += self.row_h
        self.x, self.row_h = 0, 0
        self.panels.append({
            "id": self._id(), "type": "row", "title": title, "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": [],
        })
        self.y += 1

    def panel(self, kind, title, description, unit, queries, w=8, h=8, **extra):
        if self.x + w > 24:
            self.y += self.row_h
            self.x, self.row_h = 0, 0
        targets = []
        for i, query in enumerate(queries):
            targets.append({
                "refId": query["ref"] or chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": query["expr"],
                "legendFormat": query["legend"],
                "range": True,
                "instant": False,
            })
        defaults = {"unit": unit}
        if "min" in extra:
            defaults["min"] = extra.pop("min")
        if "max" in extra:
            defaults["max"] = extra.pop("max")
        thresholds = extra.pop("thresholds", None)
        if thresholds is not None:
            steps = [{"color": "green", "value": None}]
            steps += [{"color": c, "value": v} for v, c in thresholds]
            defaults["thresholds"] = {"mode": "absolute", "steps": steps}
        p = {
            "id": self._id(),
            "type": kind,
            "title": title,
            "description": description,
            "datasource": DATASOURCE,
            "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "targets": targets,
        }
        if kind == "timeseries":
            defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                  "showPoints": "never", "spanNulls": False}
            p["options"] = {
                "legend": {"displayMode": "table", "placement": "bottom",
                           "calcs": ["lastNotNull", "max"]},
                "tooltip": {"mode": "multi", "sort": "desc"},
            }
        elif kind == "stat":
            defaults.setdefault("thresholds", {"mode": "absolute",
                                               "steps": [{"color": "green", "value": None}]})
            p["options"] = {
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "background", "graphMode": "area", "textMode": "auto",
                "justifyMode": "auto", "orientation": "auto",
            }
        p.update(extra)
        self.panels.append(p)
        self.x += w
        self.row_h = max(self.row_h, h)

    def ts(self, title, description, unit, queries, **kw):
        self.panel("timeseries", title, description, unit, queries, **kw)

    def stat(self, title, description, unit, queries, **kw):
        kw.setdefault("w", 4)
        kw.setdefault("h", 5)
        self.panel("stat", title, description, unit, queries, **kw)

    def json(self):
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": ["stocksvr"],
            "timezone": "browser",
            "schemaVersion": 39,
            "version": 1,
            "editable": False,
            "graphTooltip": 1,
            "refresh": "10s",
            "time": {"from": "now-1h", "to": "now"},
            "links": [{"type": "dashboards", "tags": ["stocksvr"], "asDropdown": False,
                       "includeVars": True, "keepTime": True, "title": "stocksvr"}],
            "templating": {"list": [VARIABLES[v] for v in self.variables]},
            "annotations": {"list": [{
                "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts", "type": "dashboard"}]},
            "panels": self.panels,
        }


def variable(name, label, query):
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query, "refresh": 2, "sort": 1,
        "multi": True, "includeAll": True, "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [], "hide": 0,
    }


VARIABLES = {
    "instance": variable("instance", "Instance", "label_values(stocksvr_build_info, instance)"),
    "group": variable("group", "Consumer group",
                      "label_values(stocksvr_consumer_group_lag, group)"),
}


# ------------------------------------------------------------------------------------------
# Overview: one screen an on-call reads top to bottom.

def overview():
    b = Board("stocksvr-overview", "stocksvr / Overview",
              "Traffic, errors, latency, lag, backlogs, stuck work, dead letters and "
              "consistency of stocksvr. Details: the Pipeline, Reservations, Scheduled "
              "confirms and Consistency dashboards.", ["instance", "group"])

    b.row("Health")
    b.stat("Dependencies not ready", "Dependencies (Kafka, registry, MySQL, Redis) whose "
           "readiness probe fails on some instance. Alert: StocksvrDependencyNotReady.", "short",
           [q(f'count(stocksvr_dependency_ready{{{INST}}} == 0) or vector(0)', "not ready")],
           thresholds=[(1, "red")])
    b.stat("Oversell alarms (1h)", "Lua invariant refusals in the last hour: stored numbers "
           "broke an invariant. Alert: StocksvrLuaInvariantRefusal.", "short",
           [q("sum(increase(stocksvr_lua_invariant_refusals_total[1h]))", "refusals")],
           thresholds=[(1, "red")])
    b.stat("Reconcile differences", "Unresolved differences between Redis and MySQL, all "
           "kinds. Alert: StocksvrReconcileDifferences / StocksvrReconcileOversell.", "short",
           [q("sum(max by (kind) (stocksvr_reconcile_differences))", "differences")],
           thresholds=[(1, "orange")])
    b.stat("Max lag", "The largest consumer lag in seconds of any stocksvr group, measured "
           "at the broker. Alert: StocksvrConsumerLagHigh (> 60 s).", "s",
           [q(f"max({LAG_SECONDS})", "lag")], thresholds=[(30, "orange"), (60, "red")])
    b.stat("Outbox backlog", "Outbox rows not yet sent to Kafka. Alert: "
           "StocksvrOutboxBacklogGrowing (> 300 and > 100/min).", "short",
           [q("max(stocksvr_outbox_backlog)", "rows")],
           thresholds=[(100, "orange"), (300, "red")])
    b.stat("Dead letters (1h)", "Records sent to a dead-letter topic in the last hour. "
           "Alert: StocksvrDeadLettersGrowing.", "short",
           [q("sum(increase(stocksvr_events_dead_lettered_total[1h]))", "dead letters")],
           thresholds=[(1, "orange")])

    b.row("Traffic and errors")
    b.ts("HTTP requests", "Requests answered per second, by route.", "reqps",
         [q(f"sum by (route) (rate(stocksvr_http_requests_total{{{INST}}}[$__rate_interval]))",
            "{{route}}")])
    b.ts("HTTP errors", "Share of requests answered 5xx, and requests shed with 503 under "
         "overload.", "percentunit",
         [q(f'(sum(rate(stocksvr_http_requests_total{{{INST},status=~"5.."}}[$__rate_interval])) '
            f"or vector(0)) / clamp_min(sum(rate(stocksvr_http_requests_total{{{INST}}}"
            "[$__rate_interval])), 1e-9)", "5xx share")], min=0)
    b.ts("Reservation operations", "Try, Confirm, Cancel, Refund and MarkCreated per second, "
         "by outcome.", "ops",
         [q(f"sum by (operation, outcome) (rate(stocksvr_reservation_operations_total{{{INST}}}"
            "[$__rate_interval]))", "{{operation}} {{outcome}}")])
    b.ts("Reservation failures", "Share of service operations that failed in stocksvr "
         "(dependency unavailable, unknown outcome, inconsistent, bucket lost), by operation.",
         "percentunit",
         # `or ... * 0`: an operation without failures has no failure series at all; it
         # shows 0, not "no data".
         [q(f"(sum by (operation) (rate(stocksvr_reservation_operations_total{{{INST},"
            f"{FAILED_OUTCOMES}}}[$__rate_interval])) or sum by (operation) (rate("
            f"stocksvr_reservation_operations_total{{{INST}}}[$__rate_interval])) * 0) / "
            f"clamp_min(sum by (operation) (rate(stocksvr_reservation_operations_total"
            f"{{{INST}}}[$__rate_interval])), 1e-9)", "{{operation}}")], min=0)
    b.ts("Service latency p50 / p99", "Latency of Try, Confirm, Cancel, Refund (histogram, "
         "1 ms to 10 s buckets).", "s",
         [q(hist("stocksvr_reservation_operation_seconds", "operation", 0.5, INST),
            "p50 {{operation}}"),
          q(hist("stocksvr_reservation_operation_seconds", "operation", 0.99, INST),
            "p99 {{operation}}")])
    b.ts("HTTP latency p50 / p99", "Latency per route.", "s",
         [q(hist("stocksvr_http_request_seconds", "route", 0.5, INST), "p50 {{route}}"),
          q(hist("stocksvr_http_request_seconds", "route", 0.99, INST), "p99 {{route}}")])

    b.row("Lag (measured at the broker)")
    b.ts("Lag per group (records)", "High watermark minus committed offset, summed over the "
         "group's partitions.", "short",
         [q(f"sum by (group) ({LAG})", "{{group}}")], min=0)
    b.ts("Lag per group (seconds)", "Age of the oldest record the group has not yet "
         "consumed (0 when caught up); grows while the group has no members.", "s",
         [q(f"max by (group) ({LAG_SECONDS})", "{{group}}")], min=0)
    b.ts("Time to drain", "Lag divided by the group's commit rate over 5 min: how long the "
         "group needs to catch up at its current pace (capped at one day: not draining).",
         "s",
         [q(f"clamp_max(sum by (group) ({LAG}) / clamp_min(sum by (group) ({COMMIT_RATE}), "
            "1e-9), 86400)", "{{group}}")], min=0)

    b.row("Backlogs")
    b.ts("Outbox backlog", "Unsent outbox rows, and their growth per minute (alert: above "
         "300 rows and growing more than 100/min).", "short",
         [q("max(stocksvr_outbox_backlog)", "rows"),
          q("max(deriv(stocksvr_outbox_backlog[2m])) * 60", "growth per min")])
    b.ts("WAL backlog", "Unfinished operation WAL rows by action.", "short",
         [q("max by (action) (stocksvr_wal_backlog)", "{{action}}")], min=0)
    b.ts("Oldest waiting work", "Age of the oldest unsent outbox row and of the oldest "
         "unfinished WAL row.", "s",
         [q("max(stocksvr_outbox_oldest_pending_seconds)", "outbox"),
          q("max by (action) (stocksvr_wal_oldest_seconds)", "wal {{action}}")], min=0)

    b.row("Stuck work and dead letters")
    b.ts("Intermediate reservations", "Reservations in an intermediate status; a stuck "
         "recovery shows as a line that does not return to 0.", "short",
         [q("max by (status) (stocksvr_reservations_intermediate)", "{{status}}"),
          q("max(stocksvr_reservations_stale)", "stale (RESERVED past expiry)")], min=0)
    b.ts("Oldest stuck work", "Age of the oldest reservation per intermediate status "
         "(alert: StocksvrReservationStuck > 10 min) and of the oldest order event deferred "
         "until its predecessor is applied (alert: StocksvrOrderEventsDeferredTooLong "
         "> 15 min).", "s",
         [q("max by (status) (stocksvr_reservations_intermediate_oldest_seconds)",
            "{{status}}"),
          q("max(stocksvr_order_events_deferred_oldest_seconds)", "deferred order event")],
         min=0)
    b.ts("Dead work", "Reservations and WAL rows marked dead, per 15 min.", "short",
         [q("sum(increase(stocksvr_reservations_dead_total[15m]))", "reservations"),
          q("sum by (action) (increase(stocksvr_wal_dead_total[15m]))", "wal {{action}}")],
         min=0)
    b.ts("Dead letters", "Records dead-lettered per 15 min by origin topic and class, and "
         "parked dead letters not yet replayed or discarded.", "short",
         [q("sum by (topic, class) (increase(stocksvr_events_dead_lettered_total[15m]))",
            "{{topic}} {{class}}"),
          q("max(stocksvr_dead_letters_parked)", "parked")], min=0)
    b.ts("Paused partitions", "Partitions paused because a dependency is down, per "
         "instance and processor.", "short",
         [q(f"sum by (instance, processor) (stocksvr_consumer_paused_partitions{{{INST}}})",
            "{{instance}} {{processor}}")], min=0)
    b.ts("Overdue and deferred", "Scheduled reservations still CREATED_RESERVED past "
         "processing time + grace at the last scan (alert: StocksvrScheduledConfirmsOverdue "
         "after 10 min), and order events deferred until their predecessor is applied.",
         "short",
         [q("max(stocksvr_schedule_overdue)", "scheduled confirms overdue"),
          q("max(stocksvr_order_events_deferred)", "deferred order events")], min=0)

    b.row("Consistency")
    b.ts("Consistent buckets", "Consistent / checked buckets in the reconciler's last pass.",
         "percentunit", [q("min(stocksvr_reconcile_consistent_ratio)", "consistent")],
         min=0, max=1)
    b.ts("Reconcile differences", "Unresolved differences by kind.", "short",
         [q("max by (kind) (stocksvr_reconcile_differences)", "{{kind}}")], min=0)
    b.ts("Lost buckets and oversell alarms", "Buckets whose Redis key is lost (they fail "
         "closed) and Lua invariant refusals per 15 min.", "short",
         [q("max(stocksvr_buckets_lost)", "lost buckets"),
          q("sum by (script) (increase(stocksvr_lua_invariant_refusals_total[15m]))",
            "refusals {{script}}")], min=0)
    return b


# ------------------------------------------------------------------------------------------
# Pipeline: Kafka lag in detail, processors, outbox and projection.

def pipeline():
    b = Board("stocksvr-pipeline", "stocksvr / Pipeline and lag",
              "Consumer lag read from the broker (every stocksvr group, with or without "
              "members), processors, deferred order events, dead-letter operations, the "
              "outbox relay and the projector.",
              ["instance", "group"])

    b.row("Consumer groups")
    b.stat("Groups without members", "stocksvr groups with committed offsets but no "
           "member: nobody consumes them.", "short",
           [q('count(max by (group) (stocksvr_consumer_group_members{group=~"$group"}) == 0) '
              "or vector(0)", "groups")], thresholds=[(1, "red")])
    b.stat("Stalled partitions", "Partitions with lag above 0 for 10 min while the committed "
           "offset never moved (alert StocksvrConsumerStalled).", "short",
           [q("count(max by (group, topic, partition) (min_over_time(stocksvr_consumer_group_lag"
              '{group=~"$group"}[10m])) > 0 and on (group, topic, partition) max by (group, '
              "topic, partition) (changes(stocksvr_consumer_group_committed_offset"
              '{group=~"$group"}[10m])) == 0) or vector(0)', "partitions")],
           thresholds=[(1, "red")])
    b.stat("Exporter rounds failing", "Lag exporter rounds that failed in the last 5 min.",
           "short",
           [q('sum(increase(stocksvr_lag_exporter_scrapes_total{outcome="error"}[5m]))',
              "errors")], thresholds=[(1, "orange")])
    b.ts("Members", "Members per consumer group, as the broker reports them.", "short",
         [q('max by (group) (stocksvr_consumer_group_members{group=~"$group"})', "{{group}}")],
         w=12, h=5, min=0)

    b.row("Lag")
    b.ts("Backlog per group and topic", "Records behind, summed over partitions.", "short",
         [q(f"sum by (group, topic) ({LAG})", "{{group}} {{topic}}")], min=0)
    b.ts("Lag in seconds per group", "Age of the oldest unconsumed record.", "s",
         [q(f"max by (group) ({LAG_SECONDS})", "{{group}}")], min=0)
    b.ts("Lag velocity", "Change of the lag in records per second over 5 min; above 0 the "
         "group falls behind.", "short",
         [q('sum by (group) (max by (group, topic, partition) (deriv(stocksvr_consumer_group_lag'
            '{group=~"$group"}[5m])))', "{{group}}")])
    b.ts("Top partitions", "The 25 partitions with the most lag.", "short",
         [q(f"topk(25, {LAG})", "{{group}} {{topic}}/{{partition}}")], min=0)
    b.ts("In vs consumed", "Records written per second to the topics the groups read, "
         "against records committed per second by each group.", "ops",
         [q('sum by (topic) (max by (topic, partition) (rate(stocksvr_topic_high_watermark'
            '[5m])))', "in {{topic}}"),
          q(f"sum by (group, topic) ({COMMIT_RATE})", "consumed {{group}} {{topic}}")],
         min=0)
    b.ts("Time to drain", "Lag divided by the commit rate (capped at one day).", "s",
         [q(f"clamp_max(sum by (group) ({LAG}) / clamp_min(sum by (group) ({COMMIT_RATE}), "
            "1e-9), 86400)", "{{group}}")], min=0)

    b.row("Processors")
    b.ts("Records consumed", "Records read per second by processor and topic.", "ops",
         [q(f"sum by (processor, topic) (rate(stocksvr_events_consumed_total{{{INST}}}"
            "[$__rate_interval]))", "{{processor}} {{topic}}")], min=0)
    b.ts("Records settled", "Records settled per second by processor and outcome.", "ops",
         [q(f"sum by (processor, outcome) (rate(stocksvr_events_applied_total{{{INST}}}"
            "[$__rate_interval]))", "{{processor}} {{outcome}}")], min=0)
    b.ts("Record age and batch time p50 / p99", "The two halves of a consumed event's delay, by "
         "processor: a record's age when the processor takes it (now minus its timestamp: the "
         "producer, the broker, the fetch and the wait behind the batch in progress) and the "
         "time to settle its batch.", "s",
         [q(hist("stocksvr_consumer_record_age_seconds", "processor", 0.5, INST), "age p50 {{processor}}"),
          q(hist("stocksvr_consumer_record_age_seconds", "processor", 0.99, INST), "age p99 {{processor}}"),
          q(hist("stocksvr_processing_seconds", "processor", 0.5, INST), "batch p50 {{processor}}"),
          q(hist("stocksvr_processing_seconds", "processor", 0.99, INST), "batch p99 {{processor}}")])
    b.ts("Retries", "Retry attempts per second, by processor.", "ops",
         [q(f"sum by (processor) (rate(stocksvr_processing_retries_total{{{INST}}}"
            "[$__rate_interval]))", "{{processor}}")], min=0)
    b.ts("Paused partitions and pauses", "Partitions paused for a dependency, and pause "
         "episodes per 15 min by dependency.", "short",
         [q(f"sum by (processor) (stocksvr_consumer_paused_partitions{{{INST}}})",
            "paused {{processor}}"),
          q(f"sum by (processor, dependency) (increase(stocksvr_consumer_pauses_total{{{INST}}}"
            "[15m]))", "pauses {{processor}} {{dependency}}")], min=0)
    b.ts("Records produced", "Records produced to Kafka and acknowledged per second, by "
         "topic.", "ops",
         [q(f"sum by (topic) (rate(stocksvr_events_produced_total{{{INST}}}"
            "[$__rate_interval]))", "{{topic}}")], min=0)

    b.row("Deferred order events")
    b.ts("Deferred order events", "Order events parked until their predecessor is applied "
         "(a RefundRequested before its OrderCreated, say). They leave as soon as the "
         "predecessor arrives; a count that only grows means predecessors are missing.",
         "short", [q("max(stocksvr_order_events_deferred)", "deferred")], w=12, min=0)
    b.ts("Oldest deferred order event", "Age of the oldest parked order event; 0 when there "
         "is none (alert: StocksvrOrderEventsDeferredTooLong above 15 min).", "s",
         [q("max(stocksvr_order_events_deferred_oldest_seconds)", "oldest")], w=12, min=0,
         thresholds=[(900, "red")])

    b.row("Dead-letter operations")
    b.ts("Dead-lettered", "Records sent to <topic>.dlt per 15 min, by processor, origin "
         "topic and class (invalid: can never apply; undecodable: not Avro of a known "
         "schema). An outage never dead-letters.", "short",
         [q(f"sum by (processor, topic, class) (increase(stocksvr_events_dead_lettered_total"
            f"{{{INST}}}[15m]))", "{{processor}} {{topic}} {{class}}")], w=6, min=0)
    b.ts("Parked", "Dead letters parked in MySQL per 15 min by dead-letter topic and class, "
         "and parked ones not yet replayed or discarded.", "short",
         [q(f"sum by (topic, class) (increase(stocksvr_dead_letters_parked_total{{{INST}}}"
            "[15m]))", "{{topic}} {{class}}"),
          q("max(stocksvr_dead_letters_parked)", "waiting for an operator")], w=6, min=0)
    b.ts("Replayed and discarded", "Parked dead letters an operator put back on their "
         "original topic (by that topic) or discarded, per 15 min. Counted by the process "
         "that did it: /admin/dlq on a scraped instance shows here, a one-off `stocksvr dlq` "
         "command does not.", "short",
         [q(f"sum by (topic) (increase(stocksvr_dead_letters_replayed_total{{{INST}}}[15m]))",
            "replayed {{topic}}"),
          q(f"sum(increase(stocksvr_dead_letters_discarded_total{{{INST}}}[15m]))",
            "discarded")], w=6, min=0)
    b.ts("Foreign dead letters", "Records on a shared dead-letter topic written by another "
         "deployment's consumer group, per 15 min: left alone, not parked here. Steady "
         "numbers mean two deployments share a topic namespace.", "short",
         [q(f"sum by (topic) (increase(stocksvr_dead_letters_foreign_total{{{INST}}}[15m]))",
            "{{topic}}")], w=6, min=0)

    b.row("Outbox relay")
    b.ts("Outbox backlog and growth", "Unsent rows and their growth per minute ("
         "alert above 300 rows and 100 rows/min).", "short",
         [q("max(stocksvr_outbox_backlog)", "rows"),
          q("max(deriv(stocksvr_outbox_backlog[2m])) * 60", "growth per min"),
          q("max(predict_linear(stocksvr_outbox_backlog[15m], 1800))", "predicted in 30 min")])
    b.ts("Outbox published", "Records published and acknowledged per second, by topic and "
         "event type (a reservation step's row goes out as two records: its stock change and "
         "its lifecycle event).", "ops",
         [q(f"sum by (topic, event_type) (rate(stocksvr_outbox_published_total{{{INST}}}"
            "[$__rate_interval]))", "{{topic}} {{event_type}}")], min=0)
    b.ts("Outbox publish failures", "Records whose publish failed per 15 min (retried with "
         "backoff), by reason: encode (payload or schema: a person must look), delivery "
         "(the broker refused), timeout (no acknowledgement in time).", "short",
         [q(f"sum by (reason, topic, event_type) (increase("
            f"stocksvr_outbox_publish_failures_total{{{INST}}}[15m]))",
            "{{reason}} {{topic}} {{event_type}}")], min=0)
    b.ts("Outbox time to drain", "Backlog (rows) divided by the publish rate (records; a step "
         "row is two, so the time can be up to twice this), capped at one day.",
         "s",
         [q("clamp_max(max(stocksvr_outbox_backlog) / clamp_min(sum(rate("
            "stocksvr_outbox_published_total[5m])), 1e-9), 86400)", "outbox")], min=0)
    b.ts("Batch publish time and publish delay p50 / p99", "Time to publish one batch "
         "(encode, send, acknowledgements, then the high-water mark or the retry marks); "
         "delay from an outbox row created to sent.", "s",
         [q(hist("stocksvr_outbox_batch_publish_seconds", "", 0.5, INST), "batch p50"),
          q(hist("stocksvr_outbox_batch_publish_seconds", "", 0.99, INST), "batch p99"),
          q(hist("stocksvr_outbox_publish_delay_seconds", "", 0.5), "delay p50"),
          q(hist("stocksvr_outbox_publish_delay_seconds", "", 0.99), "delay p99")])
    b.ts("Outbox purged", "Sent rows deleted by the purge after their retention, per 15 "
         "min. 0 for a long time while traffic flows means the purge does not run and "
         "inventory_outbox grows.", "short",
         [q(f"sum(increase(stocksvr_outbox_purged_total{{{INST}}}[15m]))", "purged")], min=0)

    b.row("Projector")
    b.ts("Projected events", "Events booked per second by the projector, by event, and "
         "projector transactions per second.", "ops",
         [q(f"sum by (event) (rate(stocksvr_projector_events_projected_total{{{INST}}}"
            "[$__rate_interval]))", "{{event}}"),
          q(f"sum(rate(stocksvr_projector_batch_size_count{{{INST}}}[$__rate_interval]))",
            "transactions")], min=0)
    b.ts("Redelivered and late events", "Per second: events whose operation the ledger had "
         "booked already (redelivery, nothing applied) and events older than the snapshot's "
         "version (booked in the ledger, snapshot left as it is).", "ops",
         [q(f"sum(rate(stocksvr_projector_duplicates_total{{{INST}}}[$__rate_interval]))",
            "duplicate"),
          q(f"sum(rate(stocksvr_projector_stale_total{{{INST}}}[$__rate_interval]))",
            "stale")], min=0)
    # The mean from _sum/_count, not histogram_quantile: the recorder gives every histogram
    # the latency buckets (up to 10), so a quantile of a count above 10 would read 10.
    b.ts("Events per transaction", "Mean number of events the projector books in one "
         "transaction (larger batches when it catches up).", "short",
         [q(f"sum(rate(stocksvr_projector_batch_size_sum{{{INST}}}[$__rate_interval])) / "
            f"clamp_min(sum(rate(stocksvr_projector_batch_size_count{{{INST}}}"
            "[$__rate_interval])), 1e-9)", "mean")], min=0)
    b.ts("Projection delay p50 / p99", "Event time to booked in snapshot and ledger.", "s",
         [q(hist("stocksvr_projection_delay_seconds", "", 0.5), "p50"),
          q(hist("stocksvr_projection_delay_seconds", "", 0.99), "p99")])
    b.ts("Periodic task rounds", "Rounds per second of each periodic task (outbox relay, "
         "recovery worker, re-driver of parked order events, time-wheel poller, ...) by what "
         "the round found. A task missing here has stopped; failed rounds are retryable "
         "database errors; empty rounds are the polls an idle deployment costs.", "ops",
         [q(f"sum by (task, outcome) (rate(stocksvr_periodic_rounds_total{{{INST}}}"
            "[$__rate_interval]))", "{{task}} {{outcome}}")], min=0)
    return b


# ------------------------------------------------------------------------------------------
# Reservations: the service, recovery, stale and dead rows, fences.

def reservations():
    b = Board("stocksvr-reservations", "stocksvr / Reservations",
              "The reservation service (Try, Confirm, Cancel, Refund), its recovery, stale "
              "and dead reservations, fences and the operation WAL.", ["instance"])

    b.row("Service")
    b.ts("Operations", "Service operations per second by operation and outcome.", "ops",
         [q(f"sum by (operation, outcome) (rate(stocksvr_reservation_operations_total{{{INST}}}"
            "[$__rate_interval]))", "{{operation}} {{outcome}}")], min=0)
    b.ts("Success ratio", "Share of operations that did not fail in stocksvr (REJECTED and "
         "invalid requests are answers, not failures).", "percentunit",
         [q(f"1 - (sum by (operation) (rate(stocksvr_reservation_operations_total{{{INST},"
            f"{FAILED_OUTCOMES}}}[$__rate_interval])) or sum by (operation) (rate("
            f"stocksvr_reservation_operations_total{{{INST}}}[$__rate_interval])) * 0) / "
            f"clamp_min(sum by (operation) (rate(stocksvr_reservation_operations_total"
            f"{{{INST}}}[$__rate_interval])), 1e-9)", "{{operation}}")], min=0, max=1)
    b.ts("Latency p50", "Median latency by operation.", "s",
         [q(hist("stocksvr_reservation_operation_seconds", "operation", 0.5, INST),
            "{{operation}}")])
    b.ts("Latency p99", "99th percentile latency by operation.", "s",
         [q(hist("stocksvr_reservation_operation_seconds", "operation", 0.99, INST),
            "{{operation}}")])
    b.ts("In flight and shed", "HTTP requests in flight, and requests refused with 503 per "
         "second by reason.", "short",
         [q(f"sum(stocksvr_http_in_flight{{{INST}}})", "in flight"),
          q(f"sum by (reason) (rate(stocksvr_http_shed_total{{{INST}}}[$__rate_interval]))",
            "shed {{reason}}")], min=0)
    b.ts("Callers", "Requests per second outside the public paths by caller and outcome "
         "(allowed, unauthorized = 401, forbidden = 403), and TLS handshakes of the HTTPS "
         "listener by outcome. A rise of unknown/unauthorized is a caller with a revoked or "
         "wrong token; handshakes close to the request rate mean callers do not keep "
         "connections alive.", "reqps",
         [q(f"sum by (client, outcome) (rate(stocksvr_http_auth_total{{{INST}}}"
            "[$__rate_interval]))", "{{client}} {{outcome}}"),
          q(f"sum by (outcome) (rate(stocksvr_http_tls_handshakes_total{{{INST}}}"
            "[$__rate_interval]))", "handshakes {{outcome}}")], min=0)
    b.ts("Try group size", "Trys written together by the group commit: mean Trys per INSERT "
         "of PREPARING rows (insert) and per transaction to RESERVED (commit). 1 means no "
         "concurrency to share a round trip with.", "short",
         [q(f"sum by (stage) (rate(stocksvr_try_group_size_sum{{{INST}}}[$__rate_interval])) / "
            f"clamp_min(sum by (stage) (rate(stocksvr_try_group_size_count{{{INST}}}"
            "[$__rate_interval])), 1e-9)", "{{stage}}")], min=0)
    # le is "1" as stocksvr writes it and "1.0" once Prometheus 3 has normalised it.
    b.ts("Groups of one", "Share of the group commit's writes that carried a single Try or "
         "step, by stage. The mean size hides them: a stage whose writes alternate between "
         "one row and many shows a mean in between. A high share under load means the first "
         "request after a write goes out alone while the rest of its wave queues behind it.",
         "percentunit",
         [q(f"sum by (stage) (rate(stocksvr_try_group_size_bucket{{{INST},le=~\"1|1.0\"}}"
            "[$__rate_interval])) / clamp_min(sum by (stage) (rate("
            f"stocksvr_try_group_size_count{{{INST}}}[$__rate_interval])), 1e-9)", "{{stage}}")],
         min=0, max=1)
    b.ts("Group write time p99", "99th percentile time one group of the group commit took "
         "to write, by stage. With one group in flight (the default) a request waits up to one "
         "such write before its own, so twice this bounds what a stage adds to a Try. The "
         "commit stage's parts (commit: open = pool connection and BEGIN, cas, outbox, "
         "commit = COMMIT with its log flush) tell which one holds its groups back.", "s",
         [q(hist("stocksvr_try_group_write_seconds", "stage", 0.99, INST), "{{stage}}"),
          q(hist("stocksvr_try_group_part_seconds", "part", 0.99, INST), "commit: {{part}}")],
         min=0)
    b.ts("Unknown outcomes and conflicts", "Redis calls with an unknown outcome (resumed with "
         "the same operation id) and conflicting order events, per second.", "ops",
         [q(f"sum by (operation) (rate(stocksvr_redis_unknown_outcomes_total{{{INST}}}"
            "[$__rate_interval]))", "unknown {{operation}}"),
          q(f"sum by (reason) (rate(stocksvr_reservation_conflicts_total{{{INST}}}"
            "[$__rate_interval]))", "conflict {{reason}}")], min=0)

    b.row("Intermediate, stale and dead")
    b.ts("Intermediate reservations", "Rows per intermediate status.", "short",
         [q("max by (status) (stocksvr_reservations_intermediate)", "{{status}}")], min=0)
    b.ts("Oldest per status", "Age of the oldest row per intermediate status.", "s",
         [q("max by (status) (stocksvr_reservations_intermediate_oldest_seconds)",
            "{{status}}")], min=0)
    b.ts("Stale and dead", "RESERVED past expiry, and reservations marked dead per 15 min.",
         "short",
         [q("max(stocksvr_reservations_stale)", "stale"),
          q("sum(increase(stocksvr_reservations_dead_total[15m]))", "dead per 15 min")], min=0)
    b.ts("Recovery attempts", "Recovery worker attempts per second by outcome.", "ops",
         [q(f"sum by (outcome) (rate(stocksvr_recovery_attempts_total{{{INST}}}"
            "[$__rate_interval]))", "{{outcome}}")], min=0)
    b.ts("Fence decisions", "Hanging Trys prevented, empty rollbacks and fenced orders per "
         "second.", "ops",
         [q(f"sum by (kind) (rate(stocksvr_fence_hits_total{{{INST}}}[$__rate_interval]))",
            "{{kind}}")], min=0)
    b.ts("Oversell alarms", "Lua invariant refusals per 15 min by script.", "short",
         [q("sum by (script) (increase(stocksvr_lua_invariant_refusals_total[15m]))",
            "{{script}}")], min=0)

    b.row("Operation WAL (bucket init, adjust, repair, rebuild, close, archive)")
    b.ts("WAL backlog", "Unfinished rows by action.", "short",
         [q("max by (action) (stocksvr_wal_backlog)", "{{action}}")], w=6, min=0)
    b.ts("Oldest unfinished WAL row", "Age by action.", "s",
         [q("max by (action) (stocksvr_wal_oldest_seconds)", "{{action}}")], w=6, min=0)
    b.ts("WAL outcomes", "Finished WAL operations per 15 min by action and outcome; dead rows; "
         "adjusts that left a deficit.", "short",
         [q("sum by (action, outcome) (increase(stocksvr_wal_operations_total[15m]))",
            "{{action}} {{outcome}}"),
          q("sum by (action) (increase(stocksvr_wal_dead_total[15m]))", "dead {{action}}"),
          q("sum(increase(stocksvr_bucket_deficit_total[15m]))", "deficits")], w=6, min=0)
    b.ts("Daily buckets prepared", "Buckets the daily job created ahead of the merchant's "
         "day, per hour (an init WAL row each). Nothing for a whole day while merchants "
         "have stock means tomorrow's buckets are missing: their first Try initialises them "
         "lazily.", "short",
         [q(f"sum(increase(stocksvr_daily_buckets_prepared_total{{{INST}}}[1h]))",
            "prepared per hour")], w=6, min=0)
    return b


# ------------------------------------------------------------------------------------------
# Scheduled confirms: the time wheel, the schedule processor and the DB scan (README,
# processors/schedule). A SCHEDULED reservation waits in CREATED_RESERVED until its
# processing_time; the wheel emits InventoryConfirmDue through the outbox, the processor
# confirms, and the scan confirms whatever the wheel missed.

def schedule():
    b = Board("stocksvr-schedule", "stocksvr / Scheduled confirms",
              "Scheduled orders confirmed at their processing_time: the Redis time wheel "
              "(armed by order-lifecycle and the scan's load-ahead, claimed by every "
              "instance's poller), InventoryConfirmDue through the outbox, the schedule "
              "processor, and the DB scan that confirms what the wheel missed.", ["instance"])

    b.row("Now")
    b.stat("Overdue", "CREATED_RESERVED reservations past processing_time + grace at the "
           "last scan (alert: StocksvrScheduledConfirmsOverdue after 10 min).", "short",
           [q("max(stocksvr_schedule_overdue)", "overdue")], thresholds=[(1, "orange")])
    b.stat("Oldest past due", "Age of the oldest CREATED_RESERVED reservation past its "
           "processing time (alert: StocksvrReservationStuck above 10 min).", "s",
           [q('max(stocksvr_reservations_intermediate_oldest_seconds'
              '{status="CREATED_RESERVED_OVERDUE"})', "age")],
           thresholds=[(300, "orange"), (600, "red")])
    b.stat("Confirmed by the scan (1h)", "Reservations the scan confirmed itself in the last "
           "hour because the wheel missed them (lost entry, emission or trigger late). A few "
           "after a Redis failover are expected; a steady number is not.", "short",
           [q(f'sum(increase(stocksvr_schedule_scan_redriven_total{{{INST},outcome="confirmed"}}'
              "[1h])) or vector(0)", "confirmed")], thresholds=[(1, "orange")])
    b.stat("Arm failures (1h)", "Time-wheel entries that could not be armed in the last "
           "hour (Redis unavailable); the scan's load-ahead arms them later.", "short",
           [q(f'sum(increase(stocksvr_schedule_armed_total{{{INST},outcome="failed"}}[1h]))',
              "failed")], thresholds=[(1, "orange")])
    b.stat("Lateness p99 (15m)", "99th percentile of how long after processing_time the "
           "wheel emitted InventoryConfirmDue, over 15 min.", "s",
           [q(f"histogram_quantile(0.99, sum by (le) (rate("
              f"stocksvr_schedule_fire_lateness_seconds_bucket{{{INST}}}[15m])))", "p99")],
           thresholds=[(1, "orange"), (5, "red")])
    b.stat("Schedule topic lag", "Age of the oldest InventoryConfirmDue the schedule "
           "processor has not consumed, measured at the broker.", "s",
           [q(f"max(max by (group, topic, partition) (stocksvr_consumer_group_lag_seconds"
              f"{{{SCHEDULE_TOPIC}}})) or vector(0)", "lag")],
           thresholds=[(30, "orange"), (60, "red")])

    b.row("Time wheel")
    b.ts("Armed", "Time-wheel entries armed per second: by order-lifecycle when OrderCreated "
         "parks a scheduled reservation, and by the scan's load-ahead for reservations due "
         "soon; added, already present, or failed (Redis unavailable).", "ops",
         [q(f"sum by (source, outcome) (rate(stocksvr_schedule_armed_total{{{INST}}}"
            "[$__rate_interval]))", "{{source}} {{outcome}}")], min=0)
    b.ts("Claimed", "Due entries claimed per second, by outcome: emitted (InventoryConfirmDue "
         "written to the outbox), already_emitted (a repeated claim), later (a refund is under "
         "way: the entry falls due again after the claim timeout), dropped with its reason "
         "(already_confirming, terminal, not_created, unknown_reservation, not_scheduled, "
         "not_an_id). unknown_reservation and not_created mean the wheel holds entries this "
         "database did not park (a wheel_namespace shared between environments); not_an_id "
         "a hand-made entry.",
         "ops",
         [q(f"sum by (outcome, reason) (rate(stocksvr_schedule_fired_total{{{INST}}}"
            "[$__rate_interval]))", "{{outcome}} {{reason}}")], min=0)
    b.ts("Fire lateness p50 / p99", "How long after processing_time the wheel emitted "
         "InventoryConfirmDue (latency buckets: values above 10 s read as 10 s).", "s",
         [q(hist("stocksvr_schedule_fire_lateness_seconds", "", 0.5, INST), "p50"),
          q(hist("stocksvr_schedule_fire_lateness_seconds", "", 0.99, INST), "p99")], min=0)

    b.row("Confirm")
    b.ts("Triggers handled", "InventoryConfirmDue records the schedule processor handled per "
         "second, by outcome (confirmed, already_confirmed, stale, lost_to_refund).", "ops",
         [q(f"sum by (outcome) (rate(stocksvr_schedule_triggers_total{{{INST}}}"
            "[$__rate_interval]))", "{{outcome}}")], min=0)
    b.ts("Scan re-drives", "Overdue reservations the scan tried to confirm itself, per 15 "
         "min, by outcome: confirmed (the wheel missed it), already_confirmed, not_yet, "
         "conflict, failed (retried next round).", "short",
         [q(f"sum by (outcome) (increase(stocksvr_schedule_scan_redriven_total{{{INST}}}"
            "[15m]))", "{{outcome}}")], min=0)
    b.ts("Overdue", "Reservations past processing_time + grace at the last scan, and "
         "CREATED_RESERVED reservations past their processing time.", "short",
         [q("max(stocksvr_schedule_overdue)", "overdue at the last scan"),
          q('max(stocksvr_reservations_intermediate{status="CREATED_RESERVED_OVERDUE"})',
            "CREATED_RESERVED past processing time")], min=0)
    b.ts("Schedule processor", "Records of inventory.schedule.v1 settled per second by "
         "outcome, retries, and records dead-lettered.", "ops",
         [q(f'sum by (outcome) (rate(stocksvr_events_applied_total{{{INST},'
            f'processor="schedule"}}[$__rate_interval]))', "{{outcome}}"),
          q(f'sum(rate(stocksvr_processing_retries_total{{{INST},processor="schedule"}}'
            "[$__rate_interval]))", "retries"),
          q(f'sum(rate(stocksvr_events_dead_lettered_total{{{INST},processor="schedule"}}'
            "[$__rate_interval]))", "dead-lettered")], min=0)
    b.ts("Confirm latency p50 / p99", "Latency of the Confirm the processor and the scan "
         "run (all Confirms of the service).", "s",
         [q(hist("stocksvr_reservation_operation_seconds", "", 0.5,
                 f'{INST},operation="confirm"'), "p50"),
          q(hist("stocksvr_reservation_operation_seconds", "", 0.99,
                 f'{INST},operation="confirm"'), "p99")])
    b.ts("Emitted through the outbox", "InventoryConfirmDue rows published by the outbox "
         "relay per second, and their publish failures per second.", "ops",
         [q(f'sum(rate(stocksvr_outbox_published_total{{{INST},'
            f'event_type="InventoryConfirmDue"}}[$__rate_interval])) or vector(0)',
            "published"),
          q(f'sum(rate(stocksvr_outbox_publish_failures_total{{{INST},'
            f'event_type="InventoryConfirmDue"}}[$__rate_interval])) or vector(0)',
            "failed")], min=0)
    return b


# ------------------------------------------------------------------------------------------
# Consistency: the reconciler and the consistency figures of docs/reconciliation.md.

def consistency():
    b = Board("stocksvr-consistency", "stocksvr / Consistency",
              "Reconciliation of Redis against MySQL, repairs, lost buckets and the delays "
              "between the stores.", [])

    b.row("Reconciler")
    b.stat("Consistent ratio", "Consistent / checked buckets in the last pass.",
           "percentunit", [q("min(stocksvr_reconcile_consistent_ratio)", "ratio")],
           thresholds=[], w=6)
    b.stat("Last pass", "Time since the last finished reconcile pass (alert: "
           "StocksvrReconcileNotRunning after 30 min).", "s",
           [q("time() - max(stocksvr_reconcile_last_pass_timestamp_seconds)", "age")],
           thresholds=[(1800, "orange")], w=6)
    b.stat("Lost buckets", "Buckets whose Redis key is lost and not yet rebuilt.", "short",
           [q("max(stocksvr_buckets_lost)", "lost")], thresholds=[(1, "red")], w=6)
    b.stat("Oldest difference", "Age of the oldest unresolved difference.", "s",
           [q("max(stocksvr_reconcile_oldest_difference_seconds)", "age")],
           thresholds=[(900, "orange")], w=6)
    b.ts("Differences by kind", "Unresolved differences (oversell pages at once).", "short",
         [q("max by (kind) (stocksvr_reconcile_differences)", "{{kind}}")], min=0)
    b.ts("Buckets checked, guards read", "Buckets compared per second, and held reservations "
         "whose fence and op record a full check read per second (at most "
         "reconcile.guard_reads_per_sec per instance; a full check of a bucket takes its held "
         "reservations / that rate).", "ops",
         [q("sum(rate(stocksvr_reconcile_buckets_checked_total[$__rate_interval]))",
            "buckets checked"),
          q("sum(rate(stocksvr_reconcile_guards_read_total[$__rate_interval]))",
            "guards read")], min=0)
    b.ts("Repairs", "Versioned repairs per 15 min by outcome.", "short",
         [q("sum by (outcome) (increase(stocksvr_reconcile_repairs_total[15m]))",
            "{{outcome}}")], min=0)
    b.ts("Repair time p95 / p99", "Detection to repaired.", "s",
         [q(hist("stocksvr_reconcile_repair_seconds", "", 0.95), "p95"),
          q(hist("stocksvr_reconcile_repair_seconds", "", 0.99), "p99")])
    b.ts("Oversell alarms", "Lua invariant refusals per 15 min.", "short",
         [q("sum by (script) (increase(stocksvr_lua_invariant_refusals_total[15m]))",
            "{{script}}")], min=0)
    b.ts("Held back", "Buckets with a difference the last pass did not report yet, by why: "
         "work in flight on the bucket, its Redis version moved during the comparison, or "
         "seen for the first time (reported once a later pass sees it again). A line that "
         "never returns to 0 is a difference that keeps escaping the report.", "short",
         [q("max by (reason) (stocksvr_reconcile_held_back)", "{{reason}}")], min=0)

    b.row("Between the stores")
    b.ts("Publish delay p50 / p99", "Outbox row created to sent.", "s",
         [q(hist("stocksvr_outbox_publish_delay_seconds", "", 0.5), "p50"),
          q(hist("stocksvr_outbox_publish_delay_seconds", "", 0.99), "p99")])
    b.ts("Projection delay p50 / p99", "Event time to booked in the snapshot and ledger.",
         "s",
         [q(hist("stocksvr_projection_delay_seconds", "", 0.5), "p50"),
          q(hist("stocksvr_projection_delay_seconds", "", 0.99), "p99")])
    b.ts("Backlogs", "Outbox rows unsent and WAL rows unfinished.", "short",
         [q("max(stocksvr_outbox_backlog)", "outbox"),
          q("sum(max by (action) (stocksvr_wal_backlog))", "wal")], min=0)
    b.ts("Oldest intermediate age", "Oldest reservation per intermediate status and oldest "
         "unfinished WAL row.", "s",
         [q("max by (status) (stocksvr_reservations_intermediate_oldest_seconds)",
            "{{status}}"),
          q("max(stocksvr_wal_oldest_seconds)", "wal")], min=0)
    b.ts("Deficits", "Merchant adjusts that left a deficit, per 15 min.", "short",
         [q("sum(increase(stocksvr_bucket_deficit_total[15m]))", "deficits")], min=0)
    return b


BOARDS = {
    "stocksvr-overview.json": overview,
    "stocksvr-pipeline.json": pipeline,
    "stocksvr-reservations.json": reservations,
    "stocksvr-schedule.json": schedule,
    "stocksvr-consistency.json": consistency,
}


def render(build):
    return json.dumps(build().json(), indent=2) + "\n"


def queries_doc():
    """docs/observability/queries.md: every panel's queries as links to the local stack's
    Prometheus graph page (variables substituted with All), for a person without Grafana."""
    from urllib.parse import quote

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import obslib

    lines = [
        "# Dashboard queries on the Prometheus graph page",
        "",
        "Generated by `tests/observability/dashboards.py` from `grafana/dashboards/`; do not edit.",
        "Each link opens the local stack's Prometheus (`scripts/stack up`, port 9090) with the",
        "panel's query filled in and template variables set to All. Pictures of the key panels",
        "from a real run: [key-panels.png](key-panels.png) (`tests/observability/live.sh --render`).",
        "",
    ]
    for build in BOARDS.values():
        board = build().json()
        variables = obslib.variables_of(board)
        lines += [f"## {board['title']}", "", board["description"], "",
                  "| panel | unit | query |", "|---|---|---|"]
        for panel in board["panels"]:
            if panel["type"] == "row":
                continue
            unit = panel["fieldConfig"]["defaults"]["unit"]
            links = []
            for t in panel["targets"]:
                expr = obslib.substitute(t["expr"], variables)
                url = ("http://127.0.0.1:9090/graph?g0.expr=" + quote(expr, safe="")
                       + "&g0.tab=0&g0.range_input=1h")
                label = t["legendFormat"].replace("{{", "").replace("}}", "") or t["refId"]
                links.append(f"[{label}]({url})")
            lines.append(f"| {panel['title']} | {unit} | {'<br>'.join(links)} |")
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare instead of writing; exit 1 when a file is stale")
    args = parser.parse_args()
    stale = []
    for name, build in BOARDS.items():
        path = OUT / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
    doc = REPO / "docs" / "observability" / "queries.md"
    text = queries_doc()
    if args.check:
        if not doc.exists() or doc.read_text() != text:
            stale.append(str(doc.relative_to(REPO)))
    else:
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(text)
        print(f"wrote {doc.relative_to(REPO)}")
    extra = sorted(p.name for p in OUT.glob("*.json") if p.name not in BOARDS)
    if extra:
        print(f"dashboards not generated by {Path(__file__).name}: {', '.join(extra)}",
              file=sys.stderr)
        return 1
    if stale:
        print(f"stale dashboards (run {Path(__file__).name}): {', '.join(stale)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
