"""Shared test configuration: tiers are folders (tests/unit, tests/cluster, tests/workloads), the cluster tier split
by lane (tests/lanes.py). At the end of a run pytest prints each tier's sum of test durations (set-up, call and
tear-down), so a run's time can be read per tier without a log tool."""

from __future__ import annotations

from collections import defaultdict

import pytest

from .lanes import tier

_TIER_OF: dict[str, str] = {}
_SECONDS: dict[str, float] = defaultdict(float)
_TESTS: dict[str, set[str]] = defaultdict(set)


def pytest_collection_finish(session: pytest.Session) -> None:
    _TIER_OF.update({item.nodeid: tier(item) for item in session.items})


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    name = _TIER_OF.get(report.nodeid)
    if name is not None:
        _SECONDS[name] += report.duration
        _TESTS[name].add(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SECONDS:
        return
    terminalreporter.section("per-tier sums")
    for name, seconds in sorted(_SECONDS.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(f"tier {name}: {seconds:.0f} s over {len(_TESTS[name])} tests")
    terminalreporter.write_line(f"tiers in all: {sum(_SECONDS.values()):.0f} s")
