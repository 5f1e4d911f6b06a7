"""Moving a SpeculatorDeployment between releases, on the real control plane: the release is part of the revision, so a
move re-audits the pair with the new release's rules and rolls verifier, draft and engine out once, together; a draft
the new release's vLLM cannot serve is refused by the audit rule that says so; a release without passed evidence is
refused and nothing that runs moves.

What these tests prove is the operator's handling of a release's level, not a release's qualification (that is
hack/qualify-release's, and its evidence is what `speculator-operator releases` shows): the operator runs in this
process, so `checked` points it at evidence for 2026.12-vllm0.34 that says every check passed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from kopf.testing import KopfRunner

from speculator_operator.domain import images, qualification
from speculator_operator.domain.releases import DEFAULT_RELEASE

from ..ckptgen import eagle3, write_checkpoint
from .conftest import SMALL, Cluster, eventually, get, sdep

pytestmark = pytest.mark.cluster
OTHER = "2026.12-vllm0.34"


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> str:
    """OTHER at level Checked for the in-process operator: a passed evidence record in a folder of the test's own."""
    folder = tmp_path_factory.mktemp("evidence")
    installed = {"vllm": "0.34.0", "torch": "2.14.0"}
    record = qualification.Evidence(
        release=OTHER, recorded="2026-12-07", machine="test", command="tests/cluster/test_release_move.py",
        images={"server": qualification.ImageEvidence(reference="server", digest="sha256:" + "0" * 64,
                                                      stack=qualification.stack_digest(installed),
                                                      installed=installed)},
        checks=[qualification.Check(name="the operator's handling of a Checked release", passed=True)],
        served="not served: a test's record",
    )  # fmt: skip
    (folder / f"{OTHER}.json").write_text(record.model_dump_json())
    monkeypatch.setattr(qualification, "EVIDENCE_DIR", folder)
    return OTHER


def _peagle(tmp_path: Path, s3: Any, store: dict[str, str]) -> str:
    """A P-EAGLE draft in the store: 0.32 serves it, 0.34 removed it."""
    config, tensors = eagle3(SMALL, algorithm="peagle", draft_vocab=1024, k=8)
    write_checkpoint(tmp_path / "peagle", config, tensors, sparse=False)
    bucket = store["good"].removeprefix("s3://").split("/")[0]
    for f in (tmp_path / "peagle").iterdir():
        s3.upload_file(str(f), bucket, f"peagle/{f.name}")
    return f"s3://{bucket}/peagle"


def _events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [e for e in get(cluster, namespace, "events")["items"] if e["involvedObject"].get("name") == name]


def _apply(cluster: Cluster, namespace: str, doc: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))


def test_a_move_to_another_release_rolls_out_once_and_a_draft_it_cannot_serve_is_refused(
    cluster: Cluster,
    operator: KopfRunner,
    checked: str,
    store: dict[str, str],
    namespace: str,
    creds: str,
    s3: Any,
    tmp_path: Path,
) -> None:
    doc = json.loads(sdep("moving", store, "good", creds))
    doc["spec"]["release"] = DEFAULT_RELEASE
    _apply(cluster, namespace, doc)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/moving", "--timeout=120s")
    before = get(cluster, namespace, "sdep/moving")["status"]
    assert (before["release"], before["releaseLevel"]) == (DEFAULT_RELEASE, "Served")
    generation = get(cluster, namespace, "deployment/moving")["metadata"]["generation"]

    doc["spec"]["release"] = checked
    _apply(cluster, namespace, doc)

    def moved() -> dict[str, Any]:
        st = get(cluster, namespace, "sdep/moving")["status"]
        assert st["release"] == checked
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
    assert f":{checked}-" in container["image"]
    reasons = [e["reason"] for e in _events(cluster, namespace, "moving")]
    assert reasons.count("ReleaseChecked") == 1
    assert reasons.count("ReleaseServed") == 1
    rolled = [e for e in _events(cluster, namespace, "moving") if e["reason"] == "RollingOut"]
    assert sum(e.get("count", 1) for e in rolled if after["revision"] in e["message"]) == 1

    # a P-EAGLE draft under the new release: vLLM 0.34 no longer serves it, and the audit says which rule
    misfit = json.loads(sdep("misfit", store, "good", creds))
    misfit["spec"]["speculator"]["source"] = _peagle(tmp_path, s3, store)
    misfit["spec"]["release"] = checked
    _apply(cluster, namespace, misfit)
    cluster.kubectl("wait", "-n", namespace, "--for=jsonpath={.status.phase}=Failed", "sdep/misfit", "--timeout=120s")
    st = get(cluster, namespace, "sdep/misfit")["status"]
    assert {c["type"]: c for c in st["conditions"]}["Audited"]["reason"] == "AuditFailed"
    assert [f["rule"] for f in st["audit"]["findings"] if f["severity"] == "error"] == ["vllm-loadable"]
    assert cluster.kubectl("get", "-n", namespace, "deployment/misfit", check=False).returncode != 0


def test_a_move_to_a_release_without_passed_evidence_is_refused_and_what_runs_stays(
    cluster: Cluster,
    operator: KopfRunner,
    store: dict[str, str],
    namespace: str,
    creds: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setattr(qualification, "EVIDENCE_DIR", tmp_path)  # no evidence: OTHER is Unqualified
    doc = json.loads(sdep("staying", store, "good", creds))
    doc["spec"]["release"] = DEFAULT_RELEASE
    _apply(cluster, namespace, doc)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/staying", "--timeout=120s")
    workload = get(cluster, namespace, "deployment/staying")

    doc["spec"]["release"] = OTHER
    _apply(cluster, namespace, doc)

    def refused() -> dict[str, Any]:
        ready = {c["type"]: c for c in get(cluster, namespace, "sdep/staying")["status"]["conditions"]}["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "ReleaseUnsupported")
        return ready  # type: ignore[no-any-return]

    eventually(refused, timeout=60)
    assert "Unqualified" in " ".join(e["message"] for e in _events(cluster, namespace, "staying")
                                     if e["reason"] == "ReleaseUnsupported")  # fmt: skip
    still = get(cluster, namespace, "deployment/staying")
    assert still["metadata"]["generation"] == workload["metadata"]["generation"]  # nothing rolled
    assert still["status"].get("readyReplicas") == workload["status"].get("readyReplicas")


def test_moving_the_operators_default_rolls_nothing_that_runs_and_new_objects_take_the_new_one(
    cluster: Cluster,
    operator: KopfRunner,
    checked: str,
    store: dict[str, str],
    namespace: str,
    creds: str,
    s3: Any,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # the in-process operator's images and default release (read at its start: runtime/settings.py), as a
    # restart with SPECULATOR_DEFAULT_RELEASE moved would have them
    started = images.Images(images.repository(), dict(images.digests()), images.default_release())
    monkeypatch.setattr(images, "_used", dataclasses.replace(started, default_release=DEFAULT_RELEASE))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("kept", store, "good", creds))  # names none
    # and a P-EAGLE pair: the default's move must not audit it by the new release's rules, which refuse it
    peagle = json.loads(sdep("kept-peagle", store, "good", creds))
    peagle["spec"]["speculator"]["source"] = _peagle(tmp_path, s3, store)
    _apply(cluster, namespace, peagle)
    for name in ("kept", "kept-peagle"):
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"sdep/{name}", "--timeout=120s")
    before = {n: get(cluster, namespace, f"sdep/{n}")["status"] for n in ("kept", "kept-peagle")}
    assert {st["release"] for st in before.values()} == {DEFAULT_RELEASE}
    generations = {n: get(cluster, namespace, f"deployment/{n}")["metadata"]["generation"] for n in before}

    monkeypatch.setattr(images, "_used", dataclasses.replace(started, default_release=checked))  # the default moves
    # a pass for each running object: its inputs resolved again on request
    for name in before:
        cluster.kubectl("annotate", "-n", namespace, f"sdep/{name}", "speculators.dev/resolve-requested=after-move")

    for name, was in before.items():

        def passed(name: str = name) -> dict[str, Any]:
            st = get(cluster, namespace, f"sdep/{name}")["status"]
            assert (st.get("requests") or {}).get("resolve") == "after-move"  # the pass acted on it
            return st  # type: ignore[no-any-return]

        after = eventually(passed, timeout=60)
        assert (after["release"], after["revision"], after["phase"]) == (DEFAULT_RELEASE, was["revision"], "Ready")
        assert after["audit"]["ok"] is True  # audited by the release it runs, not the new default
        assert get(cluster, namespace, f"deployment/{name}")["metadata"]["generation"] == generations[name]

    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=sdep("fresh", store, "good", creds))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/fresh", "--timeout=120s")
    fresh = get(cluster, namespace, "sdep/fresh")["status"]
    assert (fresh["release"], fresh["releaseLevel"]) == (checked, "Checked")
