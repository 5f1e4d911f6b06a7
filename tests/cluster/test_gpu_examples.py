"""The GPU examples (examples/gpu/) pass the real API server's validation of the CRDs: a server-side dry run of
each file, the CEL rules and the schema's strict field validation included, keeps every field as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import Cluster

pytestmark = pytest.mark.cluster

GPU = Path(__file__).resolve().parents[2] / "examples" / "gpu"
FILES = sorted(p.name for p in GPU.glob("*.yaml"))


def _kept(written: Any, stored: Any, path: str = "spec") -> list[str]:
    """What of `written` the API server did not keep as written (pruned or changed); defaults it added are fine."""
    if isinstance(written, dict):
        if not isinstance(stored, dict):
            return [path]
        return [p for k, v in written.items() for p in _kept(v, stored.get(k), f"{path}.{k}")]
    if isinstance(written, list):
        if not isinstance(stored, list) or len(stored) != len(written):
            return [path]
        return [p for i, (a, b) in enumerate(zip(written, stored, strict=True)) for p in _kept(a, b, f"{path}[{i}]")]
    return [] if written == stored else [path]


def test_there_is_an_example_of_each_kind() -> None:
    kinds = {d["kind"] for f in FILES for d in yaml.safe_load_all((GPU / f).read_text()) if d}
    assert kinds == {"Secret", "SpeculatorTrainJob", "SpeculatorDeployment"}


@pytest.mark.parametrize("name", FILES)
def test_each_example_passes_a_server_side_dry_run(
    cluster: Cluster, operator_crds: list[str], namespace: str, name: str
) -> None:
    out = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", str(GPU / name), "-o", "json"
    ).stdout
    stored = json.loads(out)
    items = stored["items"] if stored.get("kind") == "List" else [stored]
    written = [d for d in yaml.safe_load_all((GPU / name).read_text()) if d]
    assert [(o["kind"], o["metadata"]["name"]) for o in items] == [(d["kind"], d["metadata"]["name"]) for d in written]
    for doc, obj in zip(written, items, strict=True):
        if doc["kind"] == "Secret":
            assert set(obj["data"]) == set(doc["stringData"])
            continue
        assert _kept(doc["spec"], obj["spec"]) == [], f"{doc['metadata']['name']}: not kept as written"


def test_the_dry_run_refuses_what_the_crd_refuses(cluster: Cluster, operator_crds: list[str], namespace: str) -> None:
    """The check above can fail: the 8B train job with a ReadWriteOnce workspace is refused (online hidden states
    with the file backend share files between the vLLM server and the trainer)."""
    doc = yaml.safe_load((GPU / "llama-3.1-8b-eagle3-trainjob.yaml").read_text())
    doc["spec"]["workspace"]["accessMode"] = "ReadWriteOnce"
    done = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(doc), check=False)
    assert done.returncode != 0
    assert "spec.workspace.accessMode" in done.stderr
    assert "need a ReadWriteMany workspace" in done.stderr
