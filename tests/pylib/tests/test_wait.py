"""wait_until: the one polling loop of the harnesses."""

import pytest

from stocksvr_harness.wait import WaitTimeout, wait_until


class Clock:
    """A clock the loop's sleeps move, so no test waits for real."""

    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def test_returns_the_first_truthy_value():
    values = iter([0, None, [], {"n": 3}])
    clock = Clock()
    assert wait_until(lambda: next(values), 10, "n", interval=1, clock=clock, sleep=clock.sleep) == {"n": 3}
    assert clock.sleeps == [1, 1, 1]


def test_times_out_naming_what_it_waited_for_and_what_it_saw_last():
    clock = Clock()
    with pytest.raises(WaitTimeout) as e:
        wait_until(lambda: 0, 2.5, "the outbox to empty", interval=1, clock=clock, sleep=clock.sleep)
    assert str(e.value) == "timed out after 2.5 s waiting for the outbox to empty; last seen: 0"
    assert e.value.last == 0
    # The last sleep is cut to the deadline, and the predicate gets one more look there.
    assert clock.sleeps == [1, 1, 0.5]


def test_allowed_exceptions_are_not_yet_and_others_end_the_wait():
    calls = []

    def refused_then_ready():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("not listening yet")
        return "up"

    clock = Clock()
    assert wait_until(refused_then_ready, 10, "x", retry_on=(OSError,), clock=clock, sleep=clock.sleep) == "up"
    with pytest.raises(ValueError):
        wait_until(lambda: int("no"), 10, "x", retry_on=(OSError,), clock=clock, sleep=clock.sleep)


def test_a_timeout_after_an_allowed_exception_keeps_it_as_last():
    clock = Clock()

    def refused():
        raise ConnectionRefusedError("refused")

    with pytest.raises(WaitTimeout) as e:
        wait_until(refused, 1, "the API", retry_on=(OSError,), clock=clock, sleep=clock.sleep)
    assert isinstance(e.value.last, ConnectionRefusedError)


def test_a_zero_timeout_looks_once():
    calls = []
    clock = Clock()
    with pytest.raises(WaitTimeout):
        wait_until(lambda: calls.append(1), 0, "x", clock=clock, sleep=clock.sleep)
    assert calls == [1]
    assert clock.sleeps == []
