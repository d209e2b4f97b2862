"""The one polling loop of the harnesses: call a predicate until it holds or the time is up.

    rows = wait_until(lambda: db.count_pending() == 0, 90, "reservations to settle")

A fixed sleep hopes; this waits for the condition and, when it never comes, says what was
awaited, for how long and what was seen last, instead of a bare timeout.
"""

import time

from . import HarnessError


class WaitTimeout(HarnessError):
    """The condition did not hold in time. `last` is the predicate's last return value (or
    the exception it last raised, when that kind was allowed with `retry_on`)."""

    def __init__(self, what, seconds, last):
        self.what = what
        self.seconds = seconds
        self.last = last
        seen = f"; last seen: {last!r}"[:400] if last is not None else ""
        super().__init__(f"timed out after {seconds:.1f} s waiting for {what}{seen}")


def wait_until(predicate, timeout, what, interval=0.5, retry_on=(), clock=None, sleep=None):
    """Calls `predicate()` every `interval` seconds until it returns something truthy, and
    returns that. Exceptions of the kinds in `retry_on` count as "not yet" (a server still
    starting refuses connections); any other exception ends the wait at once (a process that
    exited will never answer). Raises WaitTimeout after `timeout` seconds; the predicate is
    always called at least once, and once more at the deadline. `clock` and `sleep` (default
    time.monotonic and time.sleep) let a unit test run the loop without waiting."""
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    start = clock()
    end = start + timeout
    last = None
    while True:
        try:
            last = predicate()
        except retry_on as e:
            last = e
        else:
            if last:
                return last
        now = clock()
        if now >= end:
            raise WaitTimeout(what, now - start, last)
        sleep(max(0.0, min(interval, end - now)))
