"""The deciding code reads no clock: api/, domain/, render/, planning/ and telemetry/ (the scrape's judgement lives in
planning/judgement.py) get the time handed in (`now`, read once per pass by the controller that runs it), so that
what they decide follows from what they are given. Measuring how long something took (time.monotonic,
time.perf_counter) is not deciding and stays allowed.

Two checks: every module of those packages is read for a wall-clock read (a call, or a reference such as a
`default_factory`), and a pass planned at a time long past writes only that time."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from speculator_operator import planning
from speculator_operator.adapters.checkpoints import audit
from speculator_operator.api.common import evolve, make_condition, stamp, stored
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec, SpeculatorTrainJobStatus
from speculator_operator.domain.releases import get_release
from speculator_operator.planning import deployment, trainjob
from speculator_operator.planning.health import deployment_health, trainjob_health

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint

PACKAGE = Path(planning.__file__).resolve().parents[1]
DECIDING = ("api", "domain", "render", "planning", "telemetry")
# what reads the wall clock, by the name it has where it is defined
WALL_CLOCK = {
    "datetime.datetime.now",
    "datetime.datetime.utcnow",
    "datetime.datetime.today",
    "datetime.date.today",
    "time.time",
    "time.time_ns",
}
# these read the clock only when called without the time they format
WALL_CLOCK_WITHOUT_ARGUMENT = {"time.localtime": 0, "time.gmtime": 0, "time.ctime": 0, "time.asctime": 0,
                               "time.strftime": 1}  # fmt: skip
ALLOWED: set[tuple[str, str]] = set()  # (module path, name): none


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Each name the module binds by an import, to the dotted name it stands for."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return None if base is None else f"{base}.{node.attr}"
    return None


def wall_clock_reads(source: str) -> list[tuple[int, str]]:
    """(line, name) of every wall-clock read in `source`: a reference to one of WALL_CLOCK (called or handed on),
    or a call of one of WALL_CLOCK_WITHOUT_ARGUMENT without its time."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Load):
            name = _dotted(node, aliases)
            if name in WALL_CLOCK:
                found.append((node.lineno, name))
        if isinstance(node, ast.Call):
            name = _dotted(node.func, aliases)
            if name in WALL_CLOCK_WITHOUT_ARGUMENT and len(node.args) <= WALL_CLOCK_WITHOUT_ARGUMENT[name]:
                found.append((node.lineno, f"{name}()"))
    return sorted(set(found))


def test_the_scan_finds_every_spelling_of_a_wall_clock_read() -> None:
    source = """
import datetime as dt
import time
from datetime import date, datetime
from time import time as clock, monotonic, perf_counter
from dataclasses import field

a = datetime.now()
b = dt.datetime.utcnow()
c = date.today()
d = clock()
e = time.time_ns()
f = field(default_factory=datetime.now)
g = time.strftime("%Y")
h = time.strftime("%Y", time.gmtime(0))
i = monotonic() + perf_counter() + time.monotonic()
j = datetime.fromtimestamp(0)
"""
    assert [line for line, _ in wall_clock_reads(source)] == [8, 9, 10, 11, 12, 13, 14]


def test_the_deciding_packages_read_no_wall_clock() -> None:
    found = []
    for package in DECIDING:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            where = str(path.relative_to(PACKAGE))
            for line, name in wall_clock_reads(path.read_text()):
                if (where, name) not in ALLOWED:
                    found.append(f"{where}:{line}: {name}")
    assert found == [], "the deciding code reads the clock; hand it `now` instead:\n" + "\n".join(found)


def test_a_condition_is_merged_at_the_time_handed_in_or_not_at_all() -> None:
    status = SpeculatorDeploymentStatus()
    with pytest.raises(TypeError, match="pass now"):
        evolve(status, 1, make_condition(1, "Ready", False, "R"))
    at = datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC)
    merged = evolve(status, 1, make_condition(1, "Ready", False, "R"), now=at)
    assert merged.conditions[0].last_transition_time == "2001-02-03T04:05:06Z" == stamp(at)


LONG_AGO = datetime(2001, 2, 3, 4, 5, 6, tzinfo=UTC)
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")


def timestamps(value: Any) -> set[str]:
    """Every RFC 3339 time in a wire-form status."""
    if isinstance(value, dict):
        return {t for v in value.values() for t in timestamps(v)}
    if isinstance(value, list):
        return {t for v in value for t in timestamps(v)}
    return {value} if isinstance(value, str) and TIMESTAMP.match(value) else set()


def test_a_deployment_planned_long_ago_writes_only_that_time(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "d", *eagle3())
    report = audit(str(tmp_path / "d"), verifier=QWEN3_8B, release=get_release())
    spec = SpeculatorDeploymentSpec.model_validate(
        {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}}
    )
    obs = deployment.Observed(1, SpeculatorDeploymentStatus(), "v1", report)
    p = deployment.plan("q", "ns", "uid", spec, get_release(), obs, now=LONG_AGO)
    status = stored(deployment_health(p.status, now=LONG_AGO))
    assert status["conditions"]
    assert timestamps(status) == {stamp(LONG_AGO)}


def test_a_train_job_planned_long_ago_writes_only_that_time() -> None:
    spec = SpeculatorTrainJobSpec.model_validate({
        "verifier": {"model": "Qwen/Qwen3-8B"}, "algorithm": "eagle3",
        "data": {"sources": ["hf:org/chats"], "format": "pretokenized"}, "output": {"uri": "s3://drafts/q"},
    })  # fmt: skip
    obs = trainjob.Observed(1, SpeculatorTrainJobStatus(), verifier_layers=36, verifier_revision="sha1",
                            verifier_model_type="qwen3")  # fmt: skip
    started = trainjob.plan("q", "ml", "uid", spec, get_release(), obs, now=LONG_AGO)
    failed = trainjob.failed(obs, "StageFailed", "no", now=LONG_AGO)
    for p in (started, failed):
        status = stored(trainjob_health(p.status, now=LONG_AGO))
        assert status.get("startTime") or status.get("completionTime")
        assert timestamps(status) == {stamp(LONG_AGO)}
