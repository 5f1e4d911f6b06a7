"""The children of the examples and of a spread of specs are exactly the committed snapshot's.

A refactor must leave them byte-identical; a change meant to alter them rewrites the snapshot
(`python -m tests.render_cases`) so that its diff is reviewed with the code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.render_cases import SNAPSHOTS, cases, render_case

CASES = dict(cases())


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_children_match_the_snapshot(name: str) -> None:
    fn: Callable[[], list[dict[str, Any]]] = CASES[name]
    snapshot = SNAPSHOTS / f"{name}.yaml"
    assert snapshot.is_file(), f"no snapshot for {name}: run python -m tests.render_cases"
    assert render_case(fn) == snapshot.read_text(), f"{name} renders differently: python -m tests.render_cases"


def test_every_snapshot_has_a_case() -> None:
    assert sorted(p.stem for p in SNAPSHOTS.glob("*.yaml")) == sorted(CASES)
