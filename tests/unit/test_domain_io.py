"""domain/ reads no store: S3, the hub and files are the adapters' (adapters/sources.py), which the shell opens
and hands to the audit as a `Source` (the port: its reads are the audit's only way to the bytes)."""

from __future__ import annotations

import ast
from pathlib import Path

import speculator_operator.domain

DOMAIN = Path(speculator_operator.domain.__file__).parent
IO_MODULES = ("boto3", "botocore", "huggingface_hub", "requests", "httpx", "speculator_operator.adapters")
IO_CALLS = {"open", "read_bytes", "read_text", "write_bytes", "write_text", "iterdir", "stat", "exists", "is_file"}
# the evidence records shipped inside the package (domain/evidence/*.json): data of the release table, read as a
# module's constants would be, not a store the operator reaches
PACKAGE_DATA = {("qualification.py", "is_file"), ("qualification.py", "read_text")}


def _io(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{path.name}: imports {n}" for n in names if n.startswith(IO_MODULES)]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "source":
                continue  # through the port
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in IO_CALLS and (path.name, name) not in PACKAGE_DATA:
                found.append(f"{path.name}:{node.lineno}: calls {name}")
    return found


def test_the_domain_imports_no_store_client_and_opens_no_file() -> None:
    assert [f for path in sorted(DOMAIN.rglob("*.py")) for f in _io(path)] == []


def test_the_check_finds_a_read(tmp_path: Path) -> None:
    module = tmp_path / "sources.py"
    module.write_text("import boto3\n\ndef read(p):\n    return open(p).read()\n")
    assert _io(module) == ["sources.py: imports boto3", "sources.py:4: calls open"]
