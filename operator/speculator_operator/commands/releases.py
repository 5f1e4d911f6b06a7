"""`speculator-operator releases [NAME] [-o json]`: the release table, each release's level (Served, Checked,
Unqualified: domain/qualification.py) and the evidence behind it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from speculator_operator.domain.qualification import evidence
from speculator_operator.domain.releases import DEFAULT_RELEASE, RELEASES, Release, release_row


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "releases",
        help="list the pinned releases, how far each is proven (Served, Checked, Unqualified) and the evidence",
    )
    p.add_argument("name", nargs="?", help="one release: its row, its evidence and every check")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")


def describe(release: Release) -> dict[str, Any]:
    recorded = evidence(release.name)
    return {
        "name": release.name,
        "default": release.name == DEFAULT_RELEASE,
        "level": str(release.level),
        "vllm": release.vllm,
        "speculators": release.speculators,
        "hsConnectors": release.hs_connectors,
        "torch": release.torch,
        "transformers": release.transformers,
        "servedOnCpu": release.served_on_cpu or None,
        "notes": release.notes or None,
        "evidence": None if recorded is None else recorded.model_dump(mode="json"),
    }


def _evidence_cell(row: dict[str, Any]) -> str:
    recorded = row["evidence"]
    if recorded is None:
        return "none recorded"
    checks = recorded["checks"]
    passed = sum(1 for c in checks if c["passed"])
    return f"{recorded['recorded']}: {passed}/{len(checks)} checks passed"


def run(args: argparse.Namespace) -> int:
    releases = [release_row(args.name)] if args.name else list(RELEASES.values())
    rows = [describe(r) for r in releases]
    if args.output == "json":
        print(json.dumps(rows if not args.name else rows[0], indent=2))
        return 0
    header = ["NAME", "LEVEL", "VLLM", "SPECULATORS", "TORCH", "TRANSFORMERS", "EVIDENCE"]
    table = [header] + [
        [r["name"] + (" (default)" if r["default"] else ""), r["level"], r["vllm"], r["speculators"], r["torch"],
         r["transformers"], _evidence_cell(r)]
        for r in rows
    ]  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    if args.name:
        row = rows[0]
        if row["servedOnCpu"]:
            print(f"\nserved on vLLM's CPU build, every CI run: {row['servedOnCpu']}")
        if row["notes"]:
            print(f"\n{row['notes']}")
        if row["evidence"] is not None:
            recorded = row["evidence"]
            print(f"\nevidence: {recorded['command']} on {recorded['machine']}, {recorded['recorded']}")
            for role, image in recorded["images"].items():
                print(f"  image {role}: {image['reference']}@{image['digest']} (stack {image['stack'][:19]}…)")
            for check in recorded["checks"]:
                print(f"  {'pass' if check['passed'] else 'FAIL'}  {check['name']}: {check['detail']}")
    return 0
