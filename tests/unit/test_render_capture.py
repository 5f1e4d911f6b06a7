"""What spec.learning adds to the serving pod (render/capture.py): vLLM's flags, the two halves of the capture's
settings and that the pod reads them back as the operator meant, the storage's volumes, and what stays live."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.api import podcontract
from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.deployment import SpeculatorDeploymentStatus as Status
from speculator_operator.domain.releases import get_release
from speculator_operator.planning.deployment import Observed, plan
from speculator_operator.pods.capture.config import LiveSettings
from speculator_operator.pods.capture.spool import PvcWriter, S3Writer, mounted_credentials
from speculator_operator.render import capture
from speculator_operator.render.serving import CaptureOff, Draft, Inputs, Rendered, Tuned, render

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint
from ..clock import NOW

LEARNING = {
    "capture": {"fraction": 0.25, "maxPerHour": 3600, "redact": [{"pattern": "[0-9]{16}"}]},
    "storage": {"location": "s3://captures/qwen", "credentials": {"name": "capture-writer"}},
}


def spec(
    learning: dict[str, Any] | None = LEARNING,
    *,
    replicas: int = 3,
    canary: dict[str, Any] | None = None,
    **serving: Any,
) -> SpeculatorDeploymentSpec:
    body: dict[str, Any] = {
        "verifier": {"model": "Qwen/Qwen3-8B", "revision": "main"},
        "speculator": {"source": "hf://acme/draft"},
        "serving": {"replicas": replicas, **serving},
        "upgradePolicy": {"canary": canary or {"replicas": 1}, "trainTemplate": {"algorithm": "eagle3"}},
    }
    if learning is not None:
        body["learning"] = learning
    return SpeculatorDeploymentSpec.model_validate(body)


def inputs(parsed: SpeculatorDeploymentSpec, **kw: Any) -> Inputs:
    return Inputs("qwen", "team", parsed, get_release(), Draft("eagle3", 3, "d" * 40), "v" * 40, "uid-1", **kw)


def pod(r: Rendered) -> dict[str, Any]:
    workload = next(c for c in r.children if c["kind"] == "Deployment")
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def env(r: Rendered) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod(r)["containers"][0]["env"]}


def config_map(r: Rendered) -> dict[str, Any] | None:
    return next((c for c in r.children if c["kind"] == "ConfigMap"), None)


def live(r: Rendered) -> dict[str, Any]:
    found = config_map(r)
    assert found is not None
    return json.loads(found["data"][capture.CONFIG_KEY])  # type: ignore[no-any-return]


def test_without_learning_nothing_of_the_capture_is_rendered() -> None:
    r = render(inputs(spec(None)))
    assert "--middleware" not in r.vllm_args
    assert capture.PER_REQUEST_FLAG not in r.vllm_args
    assert config_map(r) is None
    assert podcontract.CAPTURE_CONFIG_ENV not in env(r)


def test_learning_adds_the_middleware_and_each_requests_acceptance() -> None:
    r = render(inputs(spec()))
    args = r.vllm_args
    assert args[args.index("--middleware") + 1] == podcontract.CAPTURE_MIDDLEWARE
    assert args[args.index(capture.PER_REQUEST_FLAG) + 1] == "summary"
    assert r.revision != render(inputs(spec(None))).revision  # turning learning on rolls the pods


def test_with_k_tuned_to_0_there_is_no_per_request_flag() -> None:
    # vLLM refuses --per-request-spec-decode-metrics without a speculative config, which K = 0 renders none of
    r = render(inputs(spec(numSpeculativeTokens="auto"), tuned=Tuned(0)))
    assert r.speculative_config is None
    assert capture.PER_REQUEST_FLAG not in r.vllm_args
    assert "--middleware" in r.vllm_args
    assert json.loads(env(r)[podcontract.CAPTURE_POD_SETTINGS_ENV])["k"] == 0


def test_a_users_per_request_none_gives_way_to_the_captures_summary() -> None:
    r = render(inputs(spec(extraArgs=["--per-request-spec-decode-metrics", "none"])))
    flags = [a for a in r.vllm_args if a.startswith(capture.PER_REQUEST_FLAG)]
    assert flags == [capture.PER_REQUEST_FLAG, capture.PER_REQUEST_FLAG]
    assert r.vllm_args[-1] == "summary"  # the last one given wins in vLLM's parser
    assert json.loads(env(r)[podcontract.CAPTURE_POD_SETTINGS_ENV])["keepMetrics"] is False  # stripped from clients


def test_the_users_served_model_name_is_what_the_capture_expects() -> None:
    # vLLM answers with it: a response naming another model is a LoRA adapter's, and is not captured
    r = render(inputs(spec(extraArgs=["--served-model-name", "chat", "chat-v2"])))
    assert json.loads(env(r)[podcontract.CAPTURE_POD_SETTINGS_ENV])["servedModel"] == "chat"


def test_the_users_own_per_request_flag_is_kept_and_its_metrics_reach_their_clients() -> None:
    r = render(inputs(spec(extraArgs=["--per-request-spec-decode-metrics=detailed", "--enable-force-include-usage"])))
    assert [a for a in r.vllm_args if a.startswith(capture.PER_REQUEST_FLAG)] == [
        "--per-request-spec-decode-metrics=detailed"
    ]
    fixed = json.loads(env(r)[podcontract.CAPTURE_POD_SETTINGS_ENV])
    assert (fixed["keepMetrics"], fixed["forceIncludeUsage"], fixed["timingMetrics"]) == (True, True, False)


def test_what_the_operator_renders_is_what_the_pod_reads(tmp_path: Path) -> None:
    r = render(inputs(spec()))
    path = tmp_path / capture.CONFIG_KEY
    found = config_map(r)
    assert found is not None
    path.write_text(found["data"][capture.CONFIG_KEY])  # the ConfigMap's file, as the kubelet mounts it
    read = LiveSettings(str(path), pod=env(r)[podcontract.CAPTURE_POD_SETTINGS_ENV], check_seconds=0).current()
    assert read is not None
    settings = read.settings
    assert (settings.fraction, settings.mode, settings.location) == (0.25, "All", "s3://captures/qwen")
    assert (settings.namespace, settings.deployment, settings.served_model) == ("team", "qwen", "qwen")
    assert (settings.verifier_revision, settings.draft_revision, settings.k) == ("v" * 40, "d" * 40, 3)
    assert settings.served_revision == r.revision
    assert [p.pattern for p in read.patterns] == ["[0-9]{16}"]
    assert env(r)[podcontract.CAPTURE_CONFIG_ENV] == f"{capture.CONFIG_MOUNT}/{capture.CONFIG_KEY}"
    assert env(r)[podcontract.CAPTURE_POD_ENV] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_a_pods_fixed_half_wins_over_the_file(tmp_path: Path) -> None:
    # the file is shared by the incumbent and its canary: each pod labels its rows with its own pair
    r = render(inputs(spec()))
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({**live(r), "draftRevision": "another", "k": 9}))
    read = LiveSettings(str(path), pod=env(r)[podcontract.CAPTURE_POD_SETTINGS_ENV], check_seconds=0).current()
    assert read is not None
    assert (read.settings.draft_revision, read.settings.k) == ("d" * 40, 3)


@pytest.mark.parametrize(
    ("replicas", "canary", "extra", "share"),
    [(3, {"replicas": 1}, [], 900),  # a Surge canary's pod beside the 3: 3600 / 4
     (3, {"replicas": 1, "mode": "InPlace"}, [], 1200),  # InPlace takes its pod from the 3
     (3, {"replicas": 1}, ["--api-server-count", "2"], 450),  # each API-server process captures on its own
     (4, {"replicas": 1}, ["--api-server-count=3"], 240)],
)  # fmt: skip
def test_each_pod_takes_its_share_of_the_deployments_cap(
    replicas: int, canary: dict[str, Any], extra: list[str], share: int
) -> None:
    parsed = spec(replicas=replicas, canary=canary, extraArgs=extra)
    assert live(render(inputs(parsed)))["maxPerHour"] == share


def test_a_capture_change_is_live_a_storage_change_rolls() -> None:
    before = render(inputs(spec()))
    livelier = render(inputs(spec({**LEARNING, "capture": {"fraction": 1, "mode": "BelowThreshold"}})))
    assert livelier.revision == before.revision  # no rollout: the ConfigMap changes
    now = live(livelier)
    assert (now["fraction"], now["mode"], now["threshold"]) == (1, "BelowThreshold", 0.5)
    elsewhere = render(inputs(spec({**LEARNING, "storage": {"location": "s3://captures/other"}})))
    assert elsewhere.revision != before.revision


def test_s3_credentials_are_mounted_files_and_optional() -> None:
    r = render(inputs(spec()))
    volumes = {v["name"]: v for v in pod(r)["volumes"]}
    assert volumes["capture-credentials"]["secret"] == {"secretName": "capture-writer", "optional": True}
    assert volumes["capture-settings"]["configMap"] == {"name": "qwen-capture", "optional": True}
    assert env(r)[podcontract.CAPTURE_CREDENTIALS_ENV] == podcontract.CAPTURE_CREDENTIALS_MOUNT
    # not in the container's environment, where the model's own AWS_* are (the writer reads the files alone)
    assert {"secretRef": {"name": "capture-writer"}} not in pod(r)["containers"][0]["envFrom"]


def test_unreadable_credentials_turn_the_capture_off_and_say_so_but_the_pods_still_serve() -> None:
    off = CaptureOff(capture.CAPTURE_CREDENTIALS_UNREADABLE, "learning.storage.credentials: Secret team/x: Not Found")
    r = render(inputs(spec(), capture_off=off))
    assert live(r)["enabled"] is False
    assert (capture.CAPTURE_CREDENTIALS_UNREADABLE, off.message) in r.notes
    assert r.revision == render(inputs(spec())).revision  # the Secret's coming back needs no rollout


def test_a_pvc_location_mounts_its_claim_and_a_missing_claim_none() -> None:
    pvc = spec({**LEARNING, "storage": {"location": "pvc://captures/qwen"}})
    r = render(inputs(pvc))
    volumes = {v["name"]: v for v in pod(r)["volumes"]}
    assert volumes["capture-storage"]["persistentVolumeClaim"] == {"claimName": "captures"}
    mounts = {m["name"]: m["mountPath"] for m in pod(r)["containers"][0]["volumeMounts"]}
    assert mounts["capture-storage"] == podcontract.CAPTURE_PVC_MOUNT
    missing = render(inputs(pvc, capture_off=CaptureOff(capture.CAPTURE_CLAIM_MISSING, "not found", claim=True)))
    assert "capture-storage" not in {v["name"] for v in pod(missing)["volumes"]}  # a pod that mounts it cannot start
    assert live(missing)["enabled"] is False


def test_a_claims_ownership_is_not_changed_file_by_file_at_every_mount() -> None:
    pvc = render(inputs(spec({**LEARNING, "storage": {"location": "pvc://captures/qwen"}})))
    assert pod(pvc)["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    assert "fsGroupChangePolicy" not in pod(render(inputs(spec())))["securityContext"]


def test_the_config_map_is_the_deployments_child() -> None:
    found = config_map(render(inputs(spec())))
    assert found is not None
    assert (found["metadata"]["name"], found["metadata"]["namespace"]) == ("qwen-capture", "team")
    assert found["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_the_writer_reads_the_mounted_secret_as_it_is_now(tmp_path: Path) -> None:
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("writer\n")
    (tmp_path / "AWS_SECRET_ACCESS_KEY").write_text("s3cret")
    (tmp_path / "unrelated").write_text("x")
    assert mounted_credentials(str(tmp_path)) == {"AWS_ACCESS_KEY_ID": "writer", "AWS_SECRET_ACCESS_KEY": "s3cret"}
    assert mounted_credentials(str(tmp_path / "absent")) == {}
    assert mounted_credentials(None) == {}


def test_an_unmounted_claim_path_takes_no_shard(tmp_path: Path) -> None:
    assert not os.path.ismount(tmp_path)
    with pytest.raises(OSError, match="not a mounted volume"):
        PvcWriter(tmp_path, mounted=True).write("x.jsonl", b"row\n")
    assert list(tmp_path.iterdir()) == []


def test_a_key_outside_the_claim_is_refused(tmp_path: Path) -> None:
    claim = tmp_path / "claim"
    claim.mkdir()
    with pytest.raises(OSError, match="is not under"):
        PvcWriter(claim).write("../escaped.jsonl", b"row\n")
    assert not (tmp_path / "escaped.jsonl").exists()


def test_the_writer_uses_the_secrets_keys_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the serving container's own AWS_* are its model's: neither its keys nor its endpoint fill in for the Secret
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "model-reader")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "model-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://models.internal:9000")
    with pytest.raises(OSError, match="no AWS_ACCESS_KEY_ID"):
        S3Writer("captures", credentials=str(tmp_path)).write("x.jsonl", b"row\n")
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("writer")
    (tmp_path / "AWS_SECRET_ACCESS_KEY").write_text("s3cret")
    (tmp_path / "AWS_REGION").write_text("eu-west-1")
    client = S3Writer("captures", credentials=str(tmp_path))._client()
    assert "models.internal" not in client.meta.endpoint_url
    assert client._request_signer._credentials.access_key == "writer"
    (tmp_path / "AWS_ENDPOINT_URL").write_text("http://captures.internal:9000")
    writer = S3Writer("captures", credentials=str(tmp_path))
    assert writer._client().meta.endpoint_url == "http://captures.internal:9000"
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("rotated")  # the kubelet swaps the files: a new client
    assert writer._client()._request_signer._credentials.access_key == "rotated"


# ---- the pass: the ConfigMap comes and goes with spec.learning ------------------------------------------------


@pytest.fixture
def audited(tmp_path: Path) -> Any:
    write_checkpoint(tmp_path / "good", *eagle3())
    return audit(str(tmp_path / "good"), verifier=QWEN3_8B, release=get_release())


def test_turning_learning_off_deletes_its_config_map_once(audited: Any) -> None:
    on = plan("qwen", "team", "uid", spec(), get_release(), Observed(1, Status(), "v1", audited), now=NOW)
    assert "ConfigMap" not in [c["kind"] for c in on.children or []]  # applied on every path, not with the pair's
    assert [c["metadata"]["name"] for c in on.always] == ["qwen-capture"]
    assert on.status.learning is not None  # the mark that the ConfigMap is there
    assert ("v1", "ConfigMap", "qwen-capture") not in on.prune
    off = plan("qwen", "team", "uid", spec(None), get_release(), Observed(2, on.status, "v1", audited), now=NOW)
    assert "ConfigMap" not in [c["kind"] for c in off.children or []]
    assert off.always == []
    assert ("v1", "ConfigMap", "qwen-capture") in off.prune
    assert off.status.learning is None
    again = plan("qwen", "team", "uid", spec(None), get_release(), Observed(2, off.status, "v1", audited), now=NOW)
    assert ("v1", "ConfigMap", "qwen-capture") not in again.prune  # a deployment that never learned asks for no delete


def test_a_pass_that_renders_no_pair_still_applies_the_capture_or_removes_it(audited: Any) -> None:
    # an input unread (the last good pair serves on): a redaction added now must still reach the pods
    stuck = Observed(1, Status(), "v1", audited, problem=("VerifierUnreadable", "no"))
    p = plan("qwen", "team", "uid", spec(), get_release(), stuck, now=NOW)
    assert p.children is None
    assert [c["metadata"]["name"] for c in p.always] == ["qwen-capture"]
    off = plan("qwen", "team", "uid", spec(None), get_release(), replace(stuck, status=p.status), now=NOW)
    assert ("v1", "ConfigMap", "qwen-capture") in off.prune
    assert off.always == []


def test_a_missing_claim_is_said_in_the_serving_condition(audited: Any) -> None:
    pvc = spec({**LEARNING, "storage": {"location": "pvc://captures/qwen"}})
    off = CaptureOff(capture.CAPTURE_CLAIM_MISSING, "PersistentVolumeClaim team/captures not found", claim=True)
    p = plan("qwen", "team", "uid", pvc, get_release(), Observed(1, Status(), "v1", audited, capture_off=off), now=NOW)
    assert [n.reason for n in p.status.render_notes or []] == [capture.CAPTURE_CLAIM_MISSING]
    assert p.status.phase == "Deploying"  # serving goes on
