"""The replay check (replay.py): a replay from the earliest offset must change nothing. Dumps
before and after, taken with replay.dump from a state (world.FakeState); every difference must
come out of replay.diff as an anomaly naming the table and row (or the Redis key), and what
records only *when* something was processed must not."""

import copy

import pytest

import replay
from world import TAG, FakeState


def state():
    tables = {
        "inventory_reservation": [
            {"id": 1001, "order_id": 1, "status": 40, "quantity": 2, "updated_at": "12:00:01", "stale_alerted_at": None},
            {"id": 1002, "order_id": 2, "status": 25, "quantity": 1, "updated_at": "12:00:02", "stale_alerted_at": None},
        ],
        "inventory_ledger": [{"id": 1, "operation_id": "op_try_1001", "reservation_id": 1001, "created_at": "x"}],
        "inventory_inbox": [{"event_id": "e1", "consumed_at": "12:00:03"}],
        "snowflake_worker_lease": [{"id": 1, "owner": "pid 1"}],
    }
    redis = {
        f"{TAG}:stock": {"total": "10", "available": "7", "updated_at": "1"},
        f"{TAG}:reservation:1001": {"phase": "CONFIRMED", "operated_at": "5"},
        "inv:{schedule:ns:0}:due": ("zset", [["1002", 1.0], ["1001", 2.0]]),
    }
    return tables, redis


def dump(tables, redis):
    return replay.dump(FakeState(tables, redis, primary_keys={"inventory_inbox": ["event_id"]}))


def test_a_replay_that_changed_nothing_is_a_no_op():
    tables, redis = state()
    assert replay.diff(dump(tables, redis), dump(*state())) == []


def test_when_columns_and_lease_tables_are_not_compared():
    tables, redis = state()
    after_tables, after_redis = copy.deepcopy(tables), copy.deepcopy(redis)
    after_tables["inventory_reservation"][0]["updated_at"] = "13:00:00"
    after_tables["inventory_inbox"][0]["consumed_at"] = "13:00:00"
    after_tables["snowflake_worker_lease"][0]["owner"] = "pid 2"
    after_redis[f"{TAG}:stock"]["updated_at"] = "2"
    after_redis[f"{TAG}:reservation:1001"]["operated_at"] = "6"
    # A timer of a reservation no longer parked (1001 is CONFIRMED) dropped by the restart.
    after_redis["inv:{schedule:ns:0}:due"] = ("zset", [["1002", 1.0]])
    assert replay.diff(dump(tables, redis), dump(after_tables, after_redis)) == []


def test_a_row_the_replay_changed_is_an_anomaly_naming_table_and_row():
    tables, redis = state()
    after = copy.deepcopy(tables)
    after["inventory_reservation"][0]["status"] = 90  # the replay refunded a confirmed reservation
    counts = {}
    found = replay.diff(dump(tables, redis), dump(after, redis), counts=counts)
    assert counts == {"replay.inventory_reservation": 1}
    check, ids, detail = found[1]
    assert check == "replay.inventory_reservation"
    assert ids == {"id": 1001, "order_id": 1, "status": 40, "table": "inventory_reservation", "change": "changed"}
    assert detail == "status: 40 -> 90"


def test_a_row_the_replay_added_is_an_anomaly():
    tables, redis = state()
    after = copy.deepcopy(tables)
    after["inventory_ledger"].append({"id": 2, "operation_id": "op_try_1001", "reservation_id": 1001,
                                      "created_at": "y"})  # applied twice
    found = replay.diff(dump(tables, redis), dump(after, redis))
    assert [(c, ids.get("change")) for c, ids, _ in found] == [("replay.inventory_ledger", None),
                                                             ("replay.inventory_ledger", "added")]


def test_a_redis_key_the_replay_changed_or_removed_is_an_anomaly():
    tables, redis = state()
    after = copy.deepcopy(redis)
    after[f"{TAG}:stock"]["available"] = "5"
    del after[f"{TAG}:reservation:1001"]
    counts = {}
    found = replay.diff(dump(tables, redis), dump(tables, after), counts=counts)
    assert counts == {"replay.redis": 2}
    changes = {ids["change"]: detail for c, ids, detail in found if "change" in ids}
    assert changes["changed"] == "available: '7' -> '5'"
    assert "removed" in changes


def test_a_parked_reservation_s_timer_is_compared():
    tables, redis = state()
    after = copy.deepcopy(redis)
    after["inv:{schedule:ns:0}:due"] = ("zset", [["1001", 2.0]])  # 1002 is parked: its timer must stay
    assert next(c for c, _, _ in replay.diff(dump(tables, redis), dump(tables, after))) == "replay.redis"


@pytest.mark.parametrize("limit", [0, 1])
def test_listed_rows_are_capped_but_counted(limit):
    tables, redis = state()
    after = copy.deepcopy(tables)
    for r in after["inventory_reservation"]:
        r["quantity"] += 1
    counts = {}
    found = replay.diff(dump(tables, redis), dump(after, redis), limit=limit, counts=counts)
    assert counts["replay.inventory_reservation"] == 2
    assert len(found) == 1 + limit
