"""The chaos checker (checker.py), the oracle of every fault run, fed histories known to be wrong:
each must be flagged by the check that names the property, and the good history must pass.
The histories and states are built by world.py in the checker's real input format."""

import pytest

from world import (
    BUCKET,
    CANCEL,
    CANCELED,
    CONFIRMED,
    PREPARING,
    REFUND,
    REFUNDED,
    RESERVED,
    TAG,
    TRY,
    World,
)


def checks(world):
    return set(world.check())


def problems(anomaly):
    """The separate problems an applied_once anomaly lists (before its ledger ops)."""
    return anomaly["detail"].split(" (ledger ops ")[0].split("; ")


def test_the_good_history_passes_every_check():
    w = World.good()
    assert w.check() == {}


def test_the_good_history_is_really_checked():
    """The good history must pass because it is consistent, not because nothing was read."""
    w = World.good()
    from checker import Checker

    c = Checker(w.records, w.plan, w.state())
    c.run()
    assert c.stats["reservations"] == 2
    assert c.stats["ledger rows"] == 5
    assert c.stats["stock reads checked"] == 2
    assert c.stats["Trys answered RESERVED"] == 2
    assert c.stats["orders checked"] == 2
    assert c.stats["intended dead letters"] == 1


# ---- an oversell ----------------------------------------------------------------------------

def test_a_read_through_the_api_that_saw_negative_available_is_an_oversell():
    w = World.good()
    w.http_answer("stock_read", 200, {"redis": {"available": -1, "reserved": 3, "sold": 8, "deficit": 0}})
    found = w.check()
    assert set(found) == {"oversell.read"}
    assert "available" in found["oversell.read"][0]["detail"]


def test_a_direct_redis_read_that_saw_negative_sold_is_an_oversell():
    w = World.good()
    w.record("redis_read", bucket=BUCKET, stock={"available": "1", "reserved": "0", "sold": "-1"})
    assert checks(w) == {"oversell.read"}


def test_final_redis_numbers_that_do_not_add_up_are_an_oversell():
    w = World.good()
    # One unit sold twice: available + reserved + sold = 11 > total 10.
    w.redis[f"{TAG}:stock"]["sold"] = "3"
    found = w.check()
    assert "oversell.redis" in found
    assert found["oversell.redis"][0]["ids"] == {"bucket": BUCKET}


def test_final_redis_numbers_below_zero_are_an_oversell():
    w = World.good()
    # The sum still holds (-1 + 0 + 11 = 10): only the negative number tells.
    w.redis[f"{TAG}:stock"].update(available="-1", sold="11")
    found = w.check()
    assert "oversell.redis" in found
    assert "'available': -1" in found["oversell.redis"][0]["detail"]


def test_a_ledger_that_goes_below_zero_on_its_way_is_an_oversell():
    w = World.good()
    # A Try booked at version 2 before the bucket's INIT (version 1 moved to 6): in version
    # order the ledger reserves units the bucket does not have yet.
    w.find("inventory_ledger", operation_id="op_init")["redis_version"] = 6
    found = w.check()
    assert "oversell.ledger_path" in found
    assert found["oversell.ledger_path"][0]["ids"]["operation_id"] == "op_try_1001"


def test_more_sold_and_reserved_than_any_total_the_merchant_asked_for_is_an_oversell():
    w = World.good()
    w.plan[BUCKET]["totals"] = [1]  # the merchant only ever asked for 1 unit; 2 were sold
    assert checks(w) == {"oversell.total"}


# ---- a lost acknowledged Try ------------------------------------------------------------------

def test_a_try_answered_reserved_without_a_row_is_lost():
    w = World.good()
    w.try_answer(1003, 3)  # answered RESERVED, but stocksvr kept nothing of it
    found = w.check()
    assert set(found) == {"durability"}
    assert found["durability"][0]["ids"]["reservation_id"] == 1003


def test_a_try_answered_reserved_whose_row_is_still_preparing_is_lost():
    w = World.good()
    w.find("inventory_reservation", id=1002)["status"] = PREPARING
    assert "durability" in checks(w)


def test_a_try_answered_reserved_without_its_try_ledger_row_is_lost():
    w = World.good()
    w.tables["inventory_ledger"] = [r for r in w.tables["inventory_ledger"] if r["operation_id"] != "op_try_1001"]
    found = w.check()
    assert "durability" in found
    assert "no TRY row" in found["durability"][0]["detail"]


def test_a_try_answered_rejected_whose_row_holds_stock_is_flagged():
    w = World.good()
    w.try_answer(1001, 1, status="REJECTED")  # a later answer for the same reservation
    # The first answer (RESERVED) is the one judged; a reservation answered only REJECTED:
    w.try_answer(1009, 9, status="REJECTED")
    found = w.check()
    assert [a["ids"]["reservation_id"] for a in found["durability"]] == [1009]


def test_an_error_answer_is_not_an_acknowledged_try():
    w = World.good()
    w.try_answer(1003, 3, http_status=503)  # refused: nothing was promised
    assert checks(w) == set()


# ---- an operation applied twice -----------------------------------------------------------------

def test_a_try_booked_twice_in_the_ledger_is_applied_twice():
    w = World.good()
    # The same Try again under its own operation id, at a later version.
    w.ledger("op_try_1001", TRY, 6, rid=1001, available=-2, reserved=2, quantity=2)
    found = w.check()
    listed = [p for a in found["applied_once"] for p in problems(a)]
    assert "2 TRY rows" in listed  # a reservation with more than one TRY row
    assert "2 ledger rows" in listed  # the duplicate operation id, on its own


def test_a_cancel_applied_twice_under_two_operation_ids_is_applied_twice():
    w = World.good()
    w.ledger("op_cancel_1002_again", CANCEL, 6, rid=1002, available=1, reserved=-1, quantity=1)
    found = w.check()
    assert "2 CANCEL rows" in [p for a in found["applied_once"] for p in problems(a)]


def test_a_cancel_that_never_gave_the_units_back_is_flagged():
    w = World.good()
    w.tables["inventory_ledger"] = [r for r in w.tables["inventory_ledger"] if r["operation_id"] != "op_cancel_1002"]
    found = w.check()
    assert "CANCELED with 1 TRY and 0 CANCEL rows" in [p for a in found["applied_once"] for p in problems(a)]


def test_a_refund_booked_twice_is_applied_twice():
    w = World.good()
    w.refund(1001, 2, "op_refund_1", versions=(6, 7))  # the same refund operation booked at two versions
    found = w.check()
    assert "applied_once" in found
    assert any("refund DONE booked 2 times" in a["detail"] for a in found["applied_once"])


def test_ledger_deltas_that_do_not_match_the_final_status_are_flagged():
    w = World.good()
    w.find("inventory_reservation", id=1001)["status"] = RESERVED  # confirmed in the ledger only
    w.fence(1001, "RESERVED", try_op="op_try_1001")
    found = w.check()
    assert any("ledger deltas" in a["detail"] for a in found["applied_once"])


# ---- an unintended dead letter ---------------------------------------------------------------

def test_a_parked_record_nobody_sent_invalid_is_an_unintended_dead_letter():
    w = World.good()
    w.dead_letter(offset=0)  # order 1's OrderCreated, a valid event, parked
    found = w.check()
    assert set(found) == {"dead_letter.unintended"}
    ids = found["dead_letter.unintended"][0]["ids"]
    assert ids["event_id"] == "e1"
    assert ids["origin"] == "order.lifecycle.v1:0@0"


def test_an_intended_invalid_record_that_was_not_parked_is_missing():
    w = World.good()
    w.tables["inventory_dead_letter"] = []
    assert checks(w) == {"dead_letter.missing"}


# ---- the other properties ----------------------------------------------------------------------

def test_a_reservation_still_holding_stock_after_its_order_failed_is_hanging():
    w = World.good()
    # Order 2's OrderCreatedFailed was acknowledged, yet its reservation still holds the unit.
    w.find("inventory_reservation", id=1002)["status"] = RESERVED
    w.find("inventory_reservation", id=1002)["stale_alerted_at"] = "2026-12-07T12:05:00"
    w.tables["inventory_ledger"] = [r for r in w.tables["inventory_ledger"] if r["operation_id"] != "op_cancel_1002"]
    del w.redis[f"{TAG}:op:op_cancel_1002"]
    w.fence(1002, "RESERVED", try_op="op_try_1002")
    w.stock(total=10, available=7, reserved=1, sold=2, version=4)
    w.find("dish_stock_snapshot", stock_bucket_id=BUCKET)["redis_version"] = 4
    assert checks(w) == {"hanging"}


def test_a_confirmed_order_whose_reservation_was_canceled_has_the_wrong_outcome():
    w = World.good()
    r = w.find("inventory_reservation", id=1001)
    r["status"] = CANCELED
    found = w.check()
    assert "order_outcome" in found


def test_a_fence_that_disagrees_with_mysql_is_flagged():
    w = World.good()
    w.fence(1001, "RESERVED", try_op="op_try_1001")
    assert checks(w) == {"fence"}


def test_a_reservation_left_in_an_intermediate_status_is_not_terminal():
    w = World.good()
    w.reservation(1005, 5, 30, 0)  # CONFIRMING, not dead, not alerted; no ledger rows, no fence
    assert "not_terminal" in checks(w)


def test_a_dead_reservation_is_accounted_for():
    w = World.good()
    w.reservation(1005, 5, 30, 0, dead=1)
    assert "not_terminal" not in checks(w)


def test_a_snapshot_behind_redis_means_the_stores_disagree():
    w = World.good()
    w.find("dish_stock_snapshot", stock_bucket_id=BUCKET)["sold_stock"] = 1
    found = w.check()
    assert set(found) == {"stores_agree"}
    assert "snapshot sold 1 != redis 2" in found["stores_agree"][0]["detail"]


def test_a_redis_move_without_a_ledger_row_is_a_ledger_gap():
    w = World.good()
    w.op_record("op_try_1007", "TRY", 9, {"total": 10, "available": 7, "reserved": 1, "sold": 2},
                reservation_id="1007")
    found = w.check()
    assert "redis_ops" in found
    assert "ledger gap" in found["redis_ops"][0]["detail"]


def test_a_ledger_row_without_its_redis_op_record_is_flagged():
    w = World.good()
    del w.redis[f"{TAG}:op:op_confirm_1001"]
    found = w.check()
    assert any("has no Redis op record" in a["detail"] for a in found["redis_ops"])


def test_redis_versions_no_ledger_row_explains_are_flagged():
    w = World.good()
    w.redis[f"{TAG}:stock"]["version"] = "7"  # two versions nothing booked
    assert "ledger_versions" in checks(w)


def test_a_5xx_other_than_503_breaks_the_api_contract():
    w = World.good()
    w.http_answer("stock_read", 500, {"text": "boom"})
    assert checks(w) == {"http_5xx"}


def test_a_503_is_the_contract_for_an_outage():
    w = World.good()
    w.http_answer("stock_read", 503, {"error": "mysql_unavailable"})
    assert checks(w) == set()


def test_an_unexpected_item_error_inside_an_order_answer_is_flagged():
    w = World.good()
    body = {"order_id": 6, "items": [{"order_item_id": 61, "error": {"error": "reservation_not_found",
                                                                      "message": "reservation 1001 not found"}}]}
    w.http_answer("try_order", 200, body)
    found = w.check()
    assert set(found) == {"api_error"}
    assert "reservation 1001 exists, final status CONFIRMED" in found["api_error"][0]["detail"]


def test_an_order_failed_error_after_the_failure_was_acknowledged_is_the_contract():
    w = World.good()
    body = {"order_id": 2, "items": [{"order_item_id": 21, "error": {"error": "order_failed", "message": ""}}]}
    w.http_answer("try_order", 200, body)
    assert checks(w) == set()


def test_a_refunded_reservation_agrees_when_every_store_says_so():
    """A refund of both units of order 1, booked once everywhere: still a good history."""
    w = World.good()
    w.refund(1001, 2, "op_refund_1")
    w.op_record("op_refund_1", "REFUND", 6, {"total": 10, "available": 10, "reserved": 0, "sold": 0})
    w.stock(total=10, available=10, reserved=0, sold=0, version=6)
    w.records[[r["kind"] for r in w.records].index("order")]["fate"] = "canceled"
    assert w.check() == {}


@pytest.mark.parametrize("limit", [1, 2])
def test_anomalies_past_the_limit_are_counted_not_listed(limit):
    from checker import Checker

    w = World.good()
    for k in range(3):
        w.try_answer(2000 + k, 20 + k)
    c = Checker(w.records, w.plan, w.state(), limit_per_check=limit)
    found = c.run()
    assert c.per_check["durability"] == 3
    assert sum(a["check"] == "durability" for a in found) == limit


def test_status_codes_the_checker_reads_are_the_stored_ones():
    """world.py spells the codes out; the shared table must say the same."""
    from stocksvr_harness import codes

    assert (codes.RESERVED, codes.CONFIRMED, codes.CANCELED, codes.REFUNDED) == (RESERVED, CONFIRMED, CANCELED,
                                                                              REFUNDED)
    assert codes.LEDGER_TRY == TRY and codes.LEDGER_REFUND == REFUND
