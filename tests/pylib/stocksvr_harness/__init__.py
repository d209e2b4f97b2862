"""The harnesses' shared code: tests/bench, tests/chaos, tests/observability and tests/interop
run on it.

  stack   scripts/stack and scripts/toxiproxy of a private or the shared stack: up, down, pid,
          ports, the environment stocksvr processes get
  procs   the processes a harness starts: one log file each, SIGTERM with a grace, kill -9,
          SIGSTOP/SIGCONT, the last error a process logged; one-shot commands with their output
  avro    the order service's producer: the stock Confluent client and AvroSerializer
          (TopicRecordNameStrategy, schemas auto-registered), in one place
  kafka   topic and consumer-group housekeeping (create, delete by prefix, lag)
  http    one HTTP call with urllib (status, text), and waiting for an endpoint to answer
  wait    wait_until(predicate, timeout, what): the one polling loop, with a clear timeout
  codes   the integers the database stores that the checkers read (reservation status, ...)

Entry scripts (tests/<suite>/*.py run as programs) put tests/pylib on their own sys.path, so
the one environment (tests/venv.sh) holds nothing of a work tree.
"""

import os


class HarnessError(RuntimeError):
    """Something a harness needed did not happen (a script failed, a process exited, a wait
    timed out); the message says what and where its log is. Suites catch this one class."""


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCHEMAS = os.path.join(REPO, "schemas")
