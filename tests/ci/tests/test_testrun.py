"""The test runner's oracles: which cargo artifacts are test binaries, how results are
counted, the order and the selection. A runner that miscounts would let a failing suite pass."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import testrun


def artifact(pkg, kind, name, exe, test=True):
    return json.dumps(
        {
            "reason": "compiler-artifact",
            "package_id": f"path+file:///repo/processors/{pkg}#stocksvr-{pkg}@0.1.0",
            "manifest_path": f"/repo/processors/{pkg}/Cargo.toml",
            "target": {"kind": [kind], "name": name},
            "profile": {"test": test},
            "executable": exe,
        }
    )


def test_only_test_executables_are_binaries_and_each_runs_in_its_package():
    msgs = [
        "   Compiling foo v0.1.0",
        artifact("store", "lib", "stocksvr_store", "/t/deps/stocksvr_store-1"),
        artifact("store", "test", "lua_scripts", "/t/deps/lua_scripts-2"),
        artifact("stocksvr", "bin", "stocksvr", "/t/debug/stocksvr", test=False),
        artifact("stocksvr", "bin", "stocksvr", "/t/deps/stocksvr-3"),
        json.dumps({"reason": "compiler-artifact", "executable": None, "profile": {"test": True}}),
        json.dumps({"reason": "build-finished", "success": True}),
    ]
    bins = testrun.binaries(msgs)
    assert [(b.key, b.cwd) for b in bins] == [
        ("stocksvr-stocksvr:unittests-bin-stocksvr", "/repo/processors/stocksvr"),
        ("stocksvr-store:lua_scripts", "/repo/processors/store"),
        ("stocksvr-store:unittests", "/repo/processors/store"),
    ]


def test_the_package_name_comes_from_either_form_of_the_package_id():
    assert testrun.package_name("path+file:///r/processors/store#stocksvr-store@0.1.0", "store") == "stocksvr-store"
    assert testrun.package_name("path+file:///r/processors/stocksvr#0.1.0", "stocksvr") == "stocksvr"
    assert testrun.package_name("stocksvr-core 0.1.0 (path+file:///r/processors/core)", "core") == "stocksvr-core"
    assert testrun.package_name("", "core") == "core"


def test_results_are_summed_over_every_result_line():
    out = """
running 3 tests
test a ... ok
test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s
test result: FAILED. 4 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s
"""
    assert testrun.parse_results(out) == (6, 2, 1)
    assert testrun.parse_results("no summary at all") == (0, 0, 0)


def test_a_binary_that_exits_nonzero_fails_even_without_a_failed_count(tmp_path):
    script = tmp_path / "crashes"
    script.write_text("#!/bin/sh\necho 'test result: ok. 1 passed; 0 failed; 0 ignored'\nexit 101\n")
    script.chmod(0o755)
    b = testrun.Binary("p", "crashes", "test", str(script), str(tmp_path))
    o = testrun.run_one(b, [], None)
    assert (o.ok, o.passed, o.failed) == (False, 1, 0)


def test_longest_first_and_untimed_before_all():
    bins = [testrun.Binary("p", n, "test", f"/x/{n}", "/x") for n in ("a", "b", "c")]
    ordered = testrun.order(bins, {"p:a": 5.0, "p:b": 50.0})
    assert [b.name for b in ordered] == ["c", "b", "a"]


def test_select_by_package_and_name_and_refuse_an_unknown_package():
    bins = [
        testrun.Binary("store", "lua_scripts", "test", "/1", "/s"),
        testrun.Binary("store", "unittests", "lib", "/2", "/s"),
        testrun.Binary("reservation", "service", "test", "/3", "/r"),
    ]
    assert [b.key for b in testrun.select(bins, ["store:lua_scripts", "reservation:*"])] == [
        "store:lua_scripts",
        "reservation:service",
    ]
    assert testrun.select(bins, []) == bins
    try:
        testrun.select(bins, ["schedule:*"])
    except SystemExit as e:
        assert "schedule" in str(e)
    else:
        raise AssertionError("an unknown package must be refused")


FAILED_OUTPUT = """running 2 tests
test a ... FAILED
test b ... FAILED

failures:

---- a stdout ----

thread 'a' (26367) panicked at processors/stocksvr/tests/common/mod.rs:305:22:
offsets: Kafka(KafkaError (Metadata fetch error: NotCoordinator (Broker: Not coordinator)))
stack backtrace:
   0: __rustc::rust_begin_unwind
             at /rustc/library/std/src/panicking.rs:689:5
   1: core::panicking::panic_fmt
note: Some details are omitted

---- b stdout ----
thread 'b' (26368) panicked at processors/stocksvr/tests/secure.rs:212:9:
assertion `left == right` failed
  left: false
 right: true

test result: FAILED. 0 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 9.00s
"""


def test_the_digest_names_every_panicked_test_with_its_place_and_message():
    digest = testrun.failure_digest(FAILED_OUTPUT)
    assert digest == [
        "a at processors/stocksvr/tests/common/mod.rs:305:22: offsets: Kafka(KafkaError "
        "(Metadata fetch error: NotCoordinator (Broker: Not coordinator)))",
        "b at processors/stocksvr/tests/secure.rs:212:9: assertion `left == right` failed left: false right: true",
    ]


def test_a_long_message_is_cut_and_says_so():
    output = "thread 't' panicked at x.rs:1:1:\n" + "y" * 50 + "\n"
    assert testrun.failure_digest(output, limit=10) == ["t at x.rs:1:1: yyyyyyyyyy …"]


def test_backtrace_frames_are_left_out_and_the_messages_kept():
    shown = testrun.without_backtraces(FAILED_OUTPUT)
    assert "rust_begin_unwind" not in shown and "panicking.rs" not in shown
    assert "NotCoordinator" in shown and "left: false" in shown
    assert "test result: FAILED. 0 passed; 2 failed" in shown
