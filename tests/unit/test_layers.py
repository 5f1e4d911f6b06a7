"""Imports point down the layers of the package (docs/design/layout.md), lowest first:

    domain        pure facts and rules: nothing of the package below it
    api           the CRD models: they spell their enums from domain's tables (api/trainjob/rules.py, the algorithms)
    render, telemetry
                  pure builders of the children; vLLM's metrics and what acceptance says (neither imports the other)
    planning, adapters
                  the planners: they render, and judge with telemetry's figures; the I/O the core must not do
                  (checkpoint sources: S3, the Hub, folders), which the shell calls (neither imports the other)
    runtime       the operator process: it runs the planners' passes
    controllers   the kopf adapters
    pods, commands, cli
                  leaves: the in-pod code, and the command line (commands/ holds sub-commands cli.py wires): they may
                  import anything below them, and nothing below imports them

A module may import its own package and any package of a lower layer, never one of its own layer or above; the
package root (`speculator_operator`, its version) is below everything. Imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

from speculator_operator import planning

PACKAGE = Path(planning.__file__).resolve().parents[1]
LAYER = {
    "domain": 0,
    "api": 1,
    "render": 2,
    "telemetry": 2,
    "planning": 3,
    "adapters": 3,
    "runtime": 4,
    "controllers": 5,
    "pods": 6,
    "commands": 7,
    "cli": 8,
}
# (importing module, imported package) edges that point upward today, each with what removes it
KNOWN_UPWARD: set[tuple[str, str]] = set()  # none: the CLI hands runtime/entry.py the controllers' start


def package_of(path: Path) -> str:
    """The top-level package (or `cli`) of a module of the package."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported(path: Path) -> set[str]:
    """The top-level packages of speculator_operator that `path` imports (its own included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = path.relative_to(PACKAGE).parent.parts[
                : len(path.relative_to(PACKAGE).parent.parts) - node.level + 1
            ]
            names = [".".join(("speculator_operator", *base, *([node.module] if node.module else [])))]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == "speculator_operator":  # `from speculator_operator import planning`
                names = [f"speculator_operator.{a.name}" for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "speculator_operator" and len(parts) > 1 and parts[1] in LAYER:
                out.add(parts[1])
    return out


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] not in LAYER and path.name != "cli.py":
            continue  # the package root
        own = package_of(path)
        for target in imported(path) - {own}:
            if LAYER[target] >= LAYER[own]:
                found.add((str(path.relative_to(PACKAGE)), target))
    return found


def test_every_package_is_in_a_layer() -> None:
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages | {"cli"} == set(LAYER)


def test_imports_point_down_the_layers() -> None:
    found = upward_imports()
    unknown = sorted(found - KNOWN_UPWARD)
    assert unknown == [], "imports that point up (or across) the layers:\n" + "\n".join(
        f"{m} -> {t}" for m, t in unknown
    )
    assert sorted(KNOWN_UPWARD - found) == [], "no longer upward: remove it from KNOWN_UPWARD"
