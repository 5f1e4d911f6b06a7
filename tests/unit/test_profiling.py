"""The memory profile's grouping (profiling.py): allocations are told by package, a module of this project by
its own path, and the report puts the resident set beside what Python traced."""

from __future__ import annotations

import tracemalloc

from speculator_operator.runtime.profiling import _owner, _package, report


def test_allocations_are_grouped_by_package() -> None:
    site = "/venv/lib/python3.11/site-packages"
    assert _package(f"{site}/kopf/_core/reactor/processing.py") == "kopf"
    assert _package(f"{site}/six.py") == "six"
    assert (
        _package("/repo/operator/speculator_operator/runtime/scheduler.py") == "speculator_operator/runtime/scheduler"
    )
    assert _package("/usr/lib/python3.11/json/decoder.py") == "stdlib:decoder"


def test_the_report_names_the_largest_allocation_first() -> None:
    tracemalloc.start(1)
    try:
        kept = [bytearray(1024) for _ in range(4096)]  # 4 MiB from this test module
        text = report()
    finally:
        tracemalloc.stop()
    lines = text.splitlines()
    assert lines[0].startswith("resident set: ")
    assert "traced by Python: " in lines[0]
    assert lines[1].startswith("C allocator: ")
    assert lines[2].startswith("Python's allocator: ")
    assert lines[3] == "now:"
    assert "test_profiling" in lines[5], text  # the largest live allocation: the list above
    assert len(kept) == 4096


def test_the_census_counts_live_objects_by_type_without_tracing() -> None:
    class Kept:
        pass

    kept = [Kept() for _ in range(50000)]
    text = report()
    lines = text.splitlines()
    assert lines[0].startswith("resident set: ")
    assert "traced" not in lines[0]
    assert lines[1].startswith("C allocator: in use ")
    arenas = int(lines[2].split(": ")[1].split()[0])
    assert arenas >= 2  # 50,000 objects need more than one arena of 1 MiB
    end = next(i for i, line in enumerate(lines) if line.split()[1] == "dicts")  # where the dict shapes start
    rows = {line.split()[-1]: int(line.split()[1]) for line in lines[4:end]}
    assert rows.get("test_the_census_counts_live_objects_by_type_without_tracing.<locals>.Kept", 0) >= 50000, text
    assert len(kept) == 50000


def test_the_census_names_a_dict_shape_kept_many_times_and_what_holds_it() -> None:
    kept = [{"censusProbe": i, "reason": "x"} for i in range(20000)]
    lines = report().splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[1] == "dicts")
    rows = [line for line in lines[start + 1 :] if "{censusProbe,reason}" in line]
    assert len(rows) == 1, lines[start:]
    assert int(rows[0].split()[1]) >= 20000
    assert rows[0].split(" <- ")[1] == "list"  # the holder: the list above
    assert len(kept) == 20000


def test_an_allocation_is_owned_by_whoever_asked_the_standard_library() -> None:
    tracemalloc.start(4)
    try:
        import json

        kept = json.loads("[" + ",".join(['{"a": "' + "x" * 100 + '"}'] * 20000) + "]")
        snapshot = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    owners = {_owner(s.traceback) for s in snapshot.statistics("traceback")[:3]}
    assert any(o.endswith("test_profiling.py (in stdlib:decoder)") for o in owners), owners
    assert len(kept) == 20000
