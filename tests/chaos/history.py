"""The run's history: one JSON object per line, appended as things happen.

Every record has `seq` (order of writing), `mono` (time.monotonic(), seconds: durations and
ordering within the run), `wall` (UTC, RFC 3339 with microseconds: to line records up with the
servers' logs), `kind`, and the fields of that kind. Kinds written by the suite:

  phase            {name}                                   run phases (setup, workload, quiesce, ...)
  request          {op, client, method, path, body}          an HTTP request about to be sent
  response         {op, client, status, body, seconds}       its answer
  timeout          {op, client, error, seconds}              no answer (timeout, refused, reset)
  produce          {event_id, event_type, order_id, key, topic, dup, intended_dlt, ...}
  produce_ack      {event_id, topic, partition, offset, dup, intended_dlt}
  produce_error    {event_id, error}
  order            {order_id, fate, items, order_type, ...}  what the workload decided for an order
  redis_read       {bucket, stock | error}                   a direct read of a stock hash (API reads are requests)
  fault_start      {fault, fault_kind, target, params}
  fault_end        {fault, fault_kind, target, ok, detail, seconds}
  role             {role, action, pid, ...}                 role process started/killed/stopped
  quiescence       {name, ok, seconds, pending}
  anomaly          {check, ids, detail}                      written by the checker at the end

`op` ties a request to its response; `fault` ties a fault's start to its end.
"""

import datetime as _dt
import json
import threading
import time


def wall_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


class History:
    def __init__(self, path):
        self.path = path
        # Open for the whole run (close() ends it); line-buffered so a crash loses no record.
        self._f = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._lock = threading.Lock()
        self._seq = 0
        self._op = 0

    def next_op(self) -> int:
        with self._lock:
            self._op += 1
            return self._op

    def record(self, kind: str, **fields) -> dict:
        with self._lock:
            self._seq += 1
            rec = {"seq": self._seq, "mono": round(time.monotonic(), 6), "wall": wall_now(), "kind": kind}
            rec.update(fields)
            self._f.write(json.dumps(rec, separators=(",", ":"), default=str) + "\n")
            return rec

    def close(self):
        with self._lock:
            self._f.close()


def load(path):
    """Every record of a history file, in writing order."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    out.sort(key=lambda r: r["seq"])
    return out
