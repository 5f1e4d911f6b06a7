"""Moving a SpeculatorDeployment between releases, on the real control plane: the release is part of the revision, so a
move re-audits the pair with the new release's rules and rolls verifier, draft and engine out once, together; a draft
the new release's vLLM cannot serve is refused by the audit rule that says so. The move here is to the release that
is Checked only (docs/concepts/releases.md), which the status and an event say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from speculator_operator.domain.releases import DEFAULT_RELEASE, release_row

from ..ckptgen import eagle3, write_checkpoint
from .conftest import SMALL, Cluster, eventually, get, sdep

pytestmark = pytest.mark.cluster
CHECKED = "2026.12-vllm0.34"


def _events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in get(cluster, namespace, "events")["items"] if e["involvedObject"].get("name") == name]


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def test_a_move_to_another_release_rolls_out_once_and_a_draft_it_cannot_serve_is_refused(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    s3: Any,
    tmp_path: Path,
) -> None:
    if release_row(CHECKED).level.value == "Unqualified":
        pytest.fail(f"{CHECKED} has no passed evidence: run hack/qualify-release {CHECKED}")
    doc = json.loads(sdep("moving", store, "good", creds))
    doc["spec"]["release"] = DEFAULT_RELEASE
    _apply(cluster, namespace, doc)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/moving", "--timeout=120s")
    before = get(cluster, namespace, "sdep/moving")["status"]
    assert (before["release"], before["releaseLevel"]) == (DEFAULT_RELEASE, "Served")
    generation = get(cluster, namespace, "deployment/moving")["metadata"]["generation"]

    doc["spec"]["release"] = CHECKED
    _apply(cluster, namespace, doc)

    def moved() -> dict[str, Any]:
        st = get(cluster, namespace, "sdep/moving")["status"]
        assert st["release"] == CHECKED
        assert st["phase"] == "Ready"
        return st  # type: ignore[no-any-return]

    after = eventually(moved, timeout=120)
    assert after["releaseLevel"] == "Checked"
    assert after["vllm"] == "0.34.0"
    assert after["revision"] != before["revision"]
    assert after["audit"]["ok"] is True  # audited again, by 0.34's rules
    # one rollout: the workload's template changed once, to the new release's image, with the draft and verifier
    workload = get(cluster, namespace, "deployment/moving")
    assert workload["metadata"]["generation"] == generation + 1
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert f":{CHECKED}-" in container["image"]
    reasons = [e["reason"] for e in _events(cluster, namespace, "moving")]
    assert reasons.count("ReleaseChecked") == 1
    assert reasons.count("ReleaseServed") == 1
    rolled = [e for e in _events(cluster, namespace, "moving") if e["reason"] == "RollingOut"]
    assert sum(e.get("count", 1) for e in rolled if after["revision"] in e["message"]) == 1

    # a P-EAGLE draft under the new release: vLLM 0.34 no longer serves it, and the audit says which rule
    config, tensors = eagle3(SMALL, algorithm="peagle", draft_vocab=1024, k=8)
    write_checkpoint(tmp_path / "peagle", config, tensors, sparse=False)
    bucket = store["good"].removeprefix("s3://").split("/")[0]
    for f in (tmp_path / "peagle").iterdir():
        s3.upload_file(str(f), bucket, f"peagle/{f.name}")
    misfit = json.loads(sdep("misfit", store, "good", creds))
    misfit["spec"]["speculator"]["source"] = f"s3://{bucket}/peagle"
    misfit["spec"]["release"] = CHECKED
    _apply(cluster, namespace, misfit)
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Failed", "sdep/misfit", "--timeout=120s")
    st = get(cluster, namespace, "sdep/misfit")["status"]
    assert {c["type"]: c for c in st["conditions"]}["Audited"]["reason"] == "AuditFailed"
    loadable = [f["message"] for f in st["audit"]["findings"] if f["rule"] == "vllm-loadable"]
    assert loadable == ["vLLM 0.34.0 removed peagle; the pinned vLLM is 0.34.0"]
    assert cluster.kubectl("get", "-n", namespace, "deployment/misfit", check=False).returncode != 0


def test_moving_the_operators_default_rolls_nothing_that_runs_and_new_objects_take_the_new_one(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if release_row(CHECKED).level.value == "Unqualified":
        pytest.fail(f"{CHECKED} has no passed evidence: run hack/qualify-release {CHECKED}")
    monkeypatch.setenv("SPECULATOR_DEFAULT_RELEASE", DEFAULT_RELEASE)  # the in-process operator reads it per pass
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("kept", store, "good", creds))  # names none
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/kept", "--timeout=120s")
    before = get(cluster, namespace, "sdep/kept")["status"]
    assert before["release"] == DEFAULT_RELEASE
    generation = get(cluster, namespace, "deployment/kept")["metadata"]["generation"]

    monkeypatch.setenv("SPECULATOR_DEFAULT_RELEASE", CHECKED)  # the default moves
    # a pass for the running object: its inputs resolved again on request
    cluster.kubectl("annotate", "-n", namespace, "sdep/kept", "speculators.dev/resolve-requested=after-default-move")

    def passed() -> dict[str, Any]:
        st = get(cluster, namespace, "sdep/kept")["status"]
        assert (st.get("requests") or {}).get("resolve") == "after-default-move"  # the pass acted on it
        return st  # type: ignore[no-any-return]

    after = eventually(passed, timeout=60)
    assert (after["release"], after["revision"]) == (DEFAULT_RELEASE, before["revision"])
    assert get(cluster, namespace, "deployment/kept")["metadata"]["generation"] == generation  # nothing rolled

    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("fresh", store, "good", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/fresh", "--timeout=120s")
    fresh = get(cluster, namespace, "sdep/fresh")["status"]
    assert (fresh["release"], fresh["releaseLevel"]) == (CHECKED, "Checked")
