"""What ships: the operator's wheel holds the operator and nothing of the dev harness, and with only the
project's declared dependencies installed every module outside pods/ (which runs in the trainer and server
images, beside their own packages) imports."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("HOME", "/tmp")) / ".cache" / "speculator-operator"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--wheel-dir", str(out), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (found,) = out.glob("speculator_operator-*.whl")
    return found


def test_the_wheel_holds_the_operator_and_no_harness(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    modules = {n.split("/")[1] for n in names if n.startswith("speculator_operator/") and n.count("/") >= 1}
    assert {"api", "controllers", "domain", "planning", "pods", "render", "runtime", "telemetry", "cli.py"} <= modules
    assert not [n for n in names if "harness" in n or "localcluster" in n or n.startswith("tests/")]
    assert not [n for n in names if n.endswith((".yaml", ".pem", ".key"))]


def _runtime_venv() -> Path:
    """A venv with exactly [project.dependencies], cached under ~/.cache keyed by them."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    key = hashlib.sha256(json.dumps([sys.version_info[:2], deps]).encode()).hexdigest()[:12]
    venv = CACHE / f"runtime-deps-{key}"
    if not (venv / ".complete").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", *deps],
                       check=True, timeout=900)  # fmt: skip
        (venv / ".complete").touch()
    return venv


def test_every_module_outside_pods_imports_with_only_the_declared_dependencies(wheel: Path, tmp_path: Path) -> None:
    venv = _runtime_venv()
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    script = """
import importlib, pkgutil, sys
import speculator_operator
failed = []
for m in pkgutil.walk_packages(speculator_operator.__path__, "speculator_operator."):
    if m.name.startswith("speculator_operator.pods"):
        continue
    try:
        importlib.import_module(m.name)
    except Exception as exc:
        failed.append(f"{m.name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path / "site"), "HOME": str(tmp_path)}
    done = subprocess.run([str(venv / "bin" / "python"), "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # and the dev harness is not there to import
    harness = subprocess.run([str(venv / "bin" / "python"), "-c", "import speculator_harness"], env=env,
                             capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert harness.returncode != 0


def test_the_license_is_apache_2_0_in_the_repository_the_metadata_and_the_wheel(wheel: Path) -> None:
    """The README says Apache-2.0: LICENSE holds that license's text, and the package metadata says the same."""
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    with zipfile.ZipFile(wheel) as whl:
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        headers = whl.read(metadata).decode().split("\n\n", 1)[0].splitlines()
        assert "License-Expression: Apache-2.0" in headers
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in whl.namelist())
