"""docs/operations/troubleshooting.md names every reason the operator can set, so that it cannot rot: the reasons are
read out of the code (the reason enums, the kubelet's reasons the planners act on, and every literal the code hands
to a condition, a Problem, a RenderError, an event, a scrape failure or a render note), and each must appear in
the page in backticks."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from speculator_operator.api.podcontract import EvaluationOutcome, ServerExitReason
from speculator_operator.planning.health import Health
from speculator_operator.planning.inputs import AuditedReason, ServingReason, VerifierReason
from speculator_operator.planning.pods import START_REFUSED, STUCK, ImageReason
from speculator_operator.planning.sweep import SWEEP_FAILED
from speculator_operator.planning.trainjob import HandOff

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "speculator_operator"
PAGE = REPO / "docs" / "operations" / "troubleshooting.md"
REASON = re.compile(r"^[A-Z][A-Za-z0-9]+$")
# a call and the position of its reason argument
REASON_ARGUMENT = {"make_condition": 3, "failed": 1, "Problem": 0, "Verdict": 1, "RenderError": 1, "MetricsError": 0}
EVENT_TYPES = ("Normal", "Warning")


def _trees() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "pods" not in path.relative_to(PACKAGE).parts:  # the pods' own code sets no condition
            yield str(path.relative_to(PACKAGE)), ast.parse(path.read_text())


def _enums_and_constants() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    enums: dict[str, dict[str, str]] = {}
    constants: dict[str, str] = {}
    for _, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "StrEnum" for b in node.bases):
                enums[node.name] = {
                    t.id: st.value.value
                    for st in node.body
                    if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant)
                    for t in st.targets
                    if isinstance(t, ast.Name)
                }
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                constants.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return enums, constants


ENUMS, CONSTANTS = _enums_and_constants()


def _values(node: ast.expr) -> Iterator[str]:
    """The strings an expression in a reason's place can be: a literal, an enum member, a module constant, either
    branch of a conditional expression, str() of one of these."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ENUMS:
        yield ENUMS[node.value.id][node.attr]
    elif isinstance(node, ast.Attribute) and node.attr == "value":
        yield from _values(node.value)
    elif isinstance(node, ast.Name) and node.id in CONSTANTS:
        yield CONSTANTS[node.id]
    elif isinstance(node, ast.IfExp):
        yield from _values(node.body)
        yield from _values(node.orelse)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str" and node.args:
        yield from _values(node.args[0])


def _target_name(target: ast.expr) -> str | None:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
        return str(target.slice.value)
    return None


def _words(node: ast.expr) -> bool:
    """Whether an expression is a message: a string with a space, an f-string, or a slice of one."""
    if isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and " " in str(node.value))


def _reason_places(node: ast.AST) -> Iterator[ast.expr]:
    """The expressions in `node` that hold a reason."""
    if isinstance(node, ast.Call):
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        position = REASON_ARGUMENT.get(str(name))
        if position is not None and len(node.args) > position:
            yield node.args[position]
        if name == "failed" and isinstance(node.func, ast.Attribute) and len(node.args) > 2:
            yield node.args[2]  # a scrape window's failed(pod, revision, reason, message, now)
        yield from (kw.value for kw in node.keywords if kw.arg == "reason")
    elif isinstance(node, ast.Tuple) and len(node.elts) in (2, 3):
        first, second = node.elts[0], node.elts[1]
        if len(node.elts) == 3 and isinstance(first, ast.Constant) and first.value in EVENT_TYPES:
            yield second  # an event: (type, reason, message)
        elif len(node.elts) == 2 and _words(second):
            yield first  # a (reason, message) pair: a problem, an event without a type, a render note
    elif isinstance(node, ast.Dict):
        yield from (
            v
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and k.value == "reason"
        )
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            pairs = (
                zip(target.elts, node.value.elts, strict=False)
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                else [(target, node.value)]
            )
            for name_node, value in pairs:
                name = _target_name(name_node)
                if name is not None and (name == "reason" or name.endswith("_reason")):
                    yield value
                if name == "problem" and isinstance(value, ast.Tuple) and value.elts:
                    yield value.elts[0]


def code_reasons() -> dict[str, str]:
    """Every reason the code can set -> the module that sets it."""
    found: dict[str, str] = {}
    for where, tree in _trees():
        for node in ast.walk(tree):
            for place in _reason_places(node):
                for value in _values(place):
                    if REASON.match(value):
                        found.setdefault(value, where)
    for enum in (VerifierReason, AuditedReason, ServingReason, ImageReason, HandOff, ServerExitReason):
        found.update({member.value: enum.__name__ for member in enum})
    found.update({o.value: "EvaluationOutcome" for o in EvaluationOutcome if o is not EvaluationOutcome.PASSED})
    found.update({r: "planning/pods.py STUCK" for r in STUCK})  # the kubelet's, shown as they are
    found.update({START_REFUSED: "planning/pods.py", SWEEP_FAILED: "planning/sweep.py", "Unschedulable": "scheduler"})
    return found


def test_every_reason_the_code_can_set_is_in_the_troubleshooting_page() -> None:
    page = PAGE.read_text()
    missing = sorted(f"{reason} ({where})" for reason, where in code_reasons().items() if f"`{reason}`" not in page)
    assert missing == [], "docs/operations/troubleshooting.md does not explain: " + ", ".join(missing)


def test_the_reason_collector_finds_the_reasons_of_every_kind_of_place() -> None:
    """A collector that found nothing would pass the test above: it must see a literal in each kind of place."""
    found = code_reasons()
    for reason in (
        "AboveBreakEven",  # make_condition
        "InvalidSpec",  # failed() and Problem()
        "CredentialsUnreadable",  # obs.problem = (reason, message)
        "NotDeployed",  # {"reason": ...}
        "WaitingForServer",  # a reason variable
        "CanaryPromoting",  # a conditional expression
        "TunedK",  # an event tuple
        "EpochCompleted",  # a (reason, message) pair
        "OOMKilled",  # a (reason, message[:n]) pair
        "NoAddress",  # a scrape window's failed()
        "Timeout",  # MetricsError
        "PruneDeferred",  # recorder.event(reason=...)
        "LayoutUnsupported",  # RenderError(message, reason) through a module constant
    ):
        assert reason in found, reason
    assert not {h.value for h in Health} & set(found)  # condition types are not reasons
