"""scripts/bench --secure's arithmetic (secured.py): medians, ratios against the targets,
connections per minute."""

import types

import secured


def side(name, secure, rates, p99s, conns):
    runs = [{"rate": r, "p99_ms": p, "non2xx": 0, "errors": 0, "per_min": conns} for r, p in zip(rates, p99s, strict=True)]
    return types.SimpleNamespace(name=name, secure=secure, runs=runs)


def args():
    return types.SimpleNamespace(bin="/bin/stocksvr", rounds=2, secs=30)


def test_the_ratios_are_of_the_medians_and_judged_against_the_targets():
    plain = side("plaintext", False, [1000, 1200], [40.0, 44.0], {"mariadb": 0.0, "redis": 2.0, "kafka": None})
    sec = side("secured", True, [900, 1000], [50.0, 54.0], {"mariadb": 0.0, "redis": 2.0, "kafka": 4.0})
    text = secured.table([plain, sec], args())
    assert "secured / plaintext throughput 0.86 (target >= 0.8: met)" in text
    assert "secured / plaintext p99        1.24 (target <= 1.25: met)" in text
    assert "rounds 1,000 / 1,200 per s" in text
    assert "mariadb 0.0, redis 2.0, kafka n/a" in text


def test_a_missed_target_is_said():
    plain = side("plaintext", False, [1000], [40.0], {"mariadb": 0.0, "redis": 0.0, "kafka": 0.0})
    sec = side("secured", True, [700], [60.0], {"mariadb": 0.0, "redis": 0.0, "kafka": 0.0})
    text = secured.table([plain, sec], args())
    assert "throughput 0.70 (target >= 0.8: NOT met)" in text
    assert "p99        1.50 (target <= 1.25: NOT met)" in text


def test_median_skips_what_was_not_read():
    assert secured.median([3.0, None, 1.0]) == 2.0
    assert secured.median([None]) is None
