"""What the GitOps tools say of our objects, computed by their own code (hack/gitops/main.go: kstatus from
fluxcd/cli-utils as Flux and Helm 4 run it, and the Argo CD health scripts in gopher-lua as Argo CD runs them):
the scripts' own health_test.yaml cases, the cases' statuses as the operator would write them, and live objects
on the real control plane."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner

from speculator_operator.api.common import stored
from speculator_operator.api.deployment import SpeculatorDeploymentStatus
from speculator_operator.api.trainjob import SpeculatorTrainJobStatus
from speculator_operator.planning.health import deployment_health, trainjob_health

from ..clock import NOW
from .conftest import ARGOCD_SCRIPTS, SMALL, Cluster, eventually, get, gitops, sdep, stj
from .test_trainjob_controller import simulated, slow_offline

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ARGOCD_SCRIPTS
KINDS = ("SpeculatorDeployment", "SpeculatorTrainJob")

# kstatus of each Argo CD case (docs/operations/gitops.md has the table)
KSTATUS = {
    "SpeculatorDeployment": {
        "pending-train-job": "InProgress", "rolling-out": "InProgress", "ready": "Current",
        "degraded-verifier-refused": "Failed", "audit-failed": "Failed", "invalid-spec": "Failed",
        "retrain-unavailable": "Failed", "rollout-stuck": "Failed", "verifier-paused": "Current",
        "draft-paused": "Current", "retraining": "Current", "retraining-after-refusal": "InProgress",
        "generation-not-observed": "InProgress", "canary-analyzing": "InProgress", "canary-rejected": "Current",
    },
    "SpeculatorTrainJob": {
        "pending": "InProgress", "first-stage-not-started": "InProgress", "running": "Current",
        "image-pull": "Failed", "succeeded": "Current", "failed": "Failed", "generation-not-observed": "InProgress",
    },
}  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_the_argocd_health_scripts_pass_their_own_cases(bin_dir: Path, kind: str) -> None:
    done = subprocess.run([str(bin_dir / "gitops-check"), "test", str(SCRIPTS / kind)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    cases = yaml.safe_load((SCRIPTS / kind / "health_test.yaml").read_text())["tests"]
    assert done.stdout.count("ok   testdata/") == len(cases) == len(KSTATUS[kind])
    actions = SCRIPTS / kind / "actions" / "action_test.yaml"
    offered = yaml.safe_load(actions.read_text())["discoveryTests"] if actions.is_file() else []
    assert done.stdout.count("ok   actions ") == len(offered) == (3 if kind == KINDS[0] else 0)


@pytest.mark.parametrize("kind", KINDS)
def test_the_cases_are_statuses_the_operator_writes_and_kstatus_agrees_with_the_table(bin_dir: Path, kind: str) -> None:
    objects = [yaml.safe_load(p.read_text()) for p in sorted((SCRIPTS / kind / "testdata").glob("*.yaml"))]
    names = [o["metadata"]["name"] for o in objects]
    assert set(names) == set(KSTATUS[kind])
    for obj in objects:
        if obj["metadata"]["name"] == "generation-not-observed":
            continue  # a generation the operator has not read yet: kstatus and Argo CD say so without our conditions
        if kind == "SpeculatorDeployment":
            sdep_status = SpeculatorDeploymentStatus.model_validate(obj["status"])
            derived: Any = deployment_health(sdep_status, now=NOW)
            status: Any = sdep_status
        else:
            status = SpeculatorTrainJobStatus.model_validate(obj["status"])
            derived = trainjob_health(status, now=NOW)
        assert stored(derived) == stored(status), obj["metadata"]["name"]  # what a pass leaves as it is
    said = gitops(bin_dir, "kstatus", objects=objects)
    assert {n: s["status"] for n, s in zip(names, said, strict=True)} == {n: KSTATUS[kind][n] for n in names}


@pytest.mark.cluster
def test_live_deployments_as_flux_helm_and_argocd_see_them(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, bin_dir: Path
) -> None:
    missing = {**store, "missing": store["good"].rsplit("/", 1)[0] + "/not-yet-published"}
    for manifest in (sdep("fine", store, "good", creds), sdep("broken", store, "bad", creds),
                     sdep("later", missing, "missing", creds)):  # fmt: skip
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/fine", "--timeout=120s")
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Stalled", "sdep/broken", "--timeout=120s")
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Reconciling", "sdep/later", "--timeout=120s")
    objects = [get(cluster, namespace, f"sdep/{name}") for name in ("fine", "broken", "later")]
    kstatus = gitops(bin_dir, "kstatus", objects=objects)
    argocd = gitops(bin_dir, "health", str(SCRIPTS / KINDS[0] / "health.lua"), objects=objects)
    assert [k["status"] for k in kstatus] == ["Current", "Failed", "InProgress"]
    assert [a["status"] for a in argocd] == ["Healthy", "Degraded", "Progressing"]
    # the finding reaches the tools' own words: Helm and Flux print kstatus' message
    assert "fc-shape" in kstatus[1]["message"]
    assert "fc-shape" in argocd[1]["message"]
    assert argocd[2]["message"].startswith("CheckpointUnreadable")
    stalled = {c["type"]: c for c in objects[1]["status"]["conditions"]}
    assert "Reconciling" not in stalled
    assert stalled["Stalled"]["observedGeneration"] == objects[1]["metadata"]["generation"]

    # a spec edit the operator refuses still moves observedGeneration: kstatus leaves InProgress for Failed
    cluster.kubectl("patch", "-n", namespace, "sdep/fine", "--type=merge", "-p",
                    json.dumps({"spec": {"release": "0.0.1-unverified"}}))  # fmt: skip

    def refused() -> dict[str, Any]:
        obj = get(cluster, namespace, "sdep/fine")
        assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
        assert obj["status"]["phase"] == "Failed"
        return obj

    obj = eventually(refused)
    (said,) = gitops(bin_dir, "kstatus", objects=[obj])
    assert said["status"] == "Failed"
    assert {c["type"]: c for c in obj["status"]["conditions"]}["Stalled"]["reason"] == "ReleaseUnsupported"


def test_the_argocd_component_merges_both_scripts_into_argo_cds_own_configmap(bin_dir: Path, tmp_path: Path) -> None:
    """What a user's Argo CD kustomization gets from `components: [.../gitops/argocd]`: argocd-cm keeps its own
    keys and gains one health script per kind, byte for byte the files the script tests ran."""
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "argocd-cm"},
        "data": {"url": "https://argocd.example.com"},
    }))  # fmt: skip
    component = Path(os.path.relpath(REPO / "gitops" / "argocd", tmp_path))
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "namespace": "argocd",
        "resources": ["cm.yaml"], "components": [str(component)],
    }))  # fmt: skip
    done = subprocess.run([str(bin_dir / "kubectl"), "kustomize", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (cm,) = list(yaml.safe_load_all(done.stdout))
    assert (cm["metadata"]["name"], cm["metadata"]["namespace"]) == ("argocd-cm", "argocd")
    assert cm["data"].pop("url") == "https://argocd.example.com"
    actions = cm["data"].pop("resource.customizations.actions.speculators.dev_SpeculatorDeployment")
    assert cm["data"] == {
        f"resource.customizations.health.speculators.dev_{kind}": (SCRIPTS / kind / "health.lua").read_text()
        for kind in KINDS
    }
    # the actions as Argo CD reads them (ResourceActions): each script byte for byte
    parsed = yaml.safe_load(actions)
    folder = SCRIPTS / KINDS[0] / "actions"
    assert parsed["discovery.lua"] == (folder / "discovery.lua").read_text()
    assert {d["name"]: d["action.lua"] for d in parsed["definitions"]} == {
        name: (folder / name / "action.lua").read_text() for name in ("resolve-now", "resume-upgrade", "retrain-now")
    }


@pytest.mark.cluster
def test_argocd_actions_on_a_live_deployment_resolve_resume_and_retrain_once(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, bin_dir: Path
) -> None:
    """Each action script run on the live object (as Argo CD runs it), its result applied as Argo CD patches it, and
    what the operator then does: the verifier resolved now, the paused change rolled out, a retraining started."""
    assert cluster.s3 is not None
    s3 = cluster.s3.client()
    bucket = store["verifier"].removeprefix("s3://").split("/")[0]
    verifier = f"v-{namespace}-actions"
    s3.put_object(Bucket=bucket, Key=f"{verifier}/config.json", Body=json.dumps(SMALL).encode())
    doc = json.loads(sdep("asked", {**store, "verifier": f"s3://{bucket}/{verifier}"}, "good", creds))
    template = {"algorithm": "eagle3", "data": {"sources": [store["data"]], "format": "pretokenized"},
                "output": {"uri": f"s3://{bucket}/retrained-{namespace}", "credentials": {"name": creds}}}  # fmt: skip
    # polled once an hour: only the action makes it look now
    doc["spec"]["upgradePolicy"] = {"onVerifierChange": "Pause", "pollIntervalSeconds": 3600, "trainTemplate": template}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/asked", "--timeout=120s")
    before = get(cluster, namespace, "sdep/asked")
    folder = SCRIPTS / KINDS[0] / "actions"
    offered = gitops(bin_dir, "discovery", str(folder / "discovery.lua"), objects=before)
    assert offered == {"resolve-now": {"disabled": False}, "resume-upgrade": {"disabled": True},
                       "retrain-now": {"disabled": False}}  # fmt: skip

    def act(action: str) -> str:
        """Run the action on the live object and patch what it set, as Argo CD does; the value it set."""
        changed = gitops(bin_dir, "action", str(folder / action / "action.lua"),
                        objects=get(cluster, namespace, "sdep/asked"))  # fmt: skip
        key = next(k for k in changed["metadata"]["annotations"] if k.endswith(f"{action.split('-')[0]}-requested"))
        value: str = changed["metadata"]["annotations"][key]
        cluster.kubectl("patch", "-n", namespace, "sdep/asked", "--type=merge", "-p",
                        json.dumps({"metadata": {"annotations": {key: value}}}))  # fmt: skip
        return value

    s3.put_object(Bucket=bucket, Key=f"{verifier}/config.json",
                  Body=json.dumps({**SMALL, "rope_theta": 1000000}).encode())  # fmt: skip
    resolved = act("resolve-now")
    cluster.kubectl("wait", "-n", namespace, "--for=condition=VerifierCurrent=False", "sdep/asked", "--timeout=60s")
    paused = get(cluster, namespace, "sdep/asked")
    assert paused["status"]["requests"]["resolve"] == resolved
    assert {c["type"]: c for c in paused["status"]["conditions"]}["VerifierCurrent"]["reason"] == "VerifierChanged"
    assert paused["status"]["revision"] == before["status"]["revision"]
    (health,) = gitops(bin_dir, "health", str(SCRIPTS / KINDS[0] / "health.lua"), objects=[paused])
    assert health["status"] == "Suspended"
    assert gitops(bin_dir, "kstatus", objects=[paused])[0]["status"] == "Current"
    assert gitops(bin_dir, "discovery", str(folder / "discovery.lua"), objects=paused)["resume-upgrade"] == {
        "disabled": False
    }

    resumed = act("resume-upgrade")

    def rolled() -> dict[str, Any]:
        obj = get(cluster, namespace, "sdep/asked")
        assert obj["status"]["requests"].get("resume") == resumed
        assert obj["status"]["verifierRevision"] != before["status"]["verifierRevision"]
        assert {c["type"]: c for c in obj["status"]["conditions"]}["VerifierCurrent"]["status"] == "True"
        return obj  # type: ignore[no-any-return]

    eventually(rolled, timeout=120)
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/asked", "--timeout=120s")
    assert get(cluster, namespace, "sdep/asked")["status"]["revision"] != before["status"]["revision"]

    retrain = act("retrain-now")

    def retraining() -> dict[str, Any]:
        obj = get(cluster, namespace, "sdep/asked")
        assert obj["status"]["requests"].get("retrain") == retrain
        assert obj["status"].get("retrain"), "no retraining yet"
        return obj  # type: ignore[no-any-return]

    retraining_now = eventually(retraining, timeout=60)
    job = retraining_now["status"]["retrain"]["job"]
    # retraining while the pair serves: Current for kstatus (Ready stays True), Progressing for Argo CD
    assert gitops(bin_dir, "kstatus", objects=[retraining_now])[0]["status"] == "Current"
    assert (
        gitops(bin_dir, "health", str(SCRIPTS / KINDS[0] / "health.lua"), objects=[retraining_now])[0]["status"]
        == "Progressing"
    )
    created = get(cluster, namespace, f"stj/{job}")
    assert created["spec"]["deployTo"] == "asked"
    # acted on once: the same value again starts nothing more
    jobs = get(cluster, namespace, "speculatortrainjobs")["items"]
    assert [j["metadata"]["name"] for j in jobs] == [job]
    assert "speculators.dev/retrain-requested" not in (created["metadata"].get("annotations") or {})
    obj = get(cluster, namespace, "sdep/asked")
    assert obj["metadata"]["annotations"]["speculators.dev/retrain-requested"] == retrain  # the operator never wrote it


def _chart(root: Path, name: str, manifest: str) -> Path:
    """A chart holding one SpeculatorDeployment, as a user's own chart would."""
    (root / name / "templates").mkdir(parents=True)
    (root / name / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": name, "version": "0.1.0"}))
    (root / name / "templates" / "speculator.yaml").write_text(yaml.safe_dump(json.loads(manifest)))
    return root / name


@pytest.mark.cluster
def test_helm_install_wait_returns_on_ready_and_fails_before_its_timeout_naming_the_finding(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, tmp_path: Path
) -> None:
    """The harness's helm 4 (`--wait`: kstatus, fluxcd/cli-utils) on charts holding a SpeculatorDeployment."""
    exe = Path(cluster.kubectl_path).with_name("helm")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": str(tmp_path / "c"),
           "HELM_CONFIG_HOME": str(tmp_path / "f"), "HELM_DATA_HOME": str(tmp_path / "d")}  # fmt: skip

    def install(release: str, chart: Path) -> subprocess.CompletedProcess[str]:
        args = [str(exe), "install", release, str(chart), "-n", namespace, "--wait", "--timeout", "300s"]
        return subprocess.run(args, capture_output=True, text=True, env=env, timeout=400)

    good = install("good", _chart(tmp_path, "good", sdep("good", store, "good", creds)))
    assert good.returncode == 0, good.stderr
    ready = {c["type"]: c for c in get(cluster, namespace, "sdep/good")["status"]["conditions"]}["Ready"]
    assert ready["status"] == "True"  # it returned because the deployment is Ready, not before

    broken = install("broken", _chart(tmp_path, "broken", sdep("broken", store, "bad", creds)))
    assert broken.returncode != 0
    # kstatus' Failed with the Stalled message, not the timeout
    assert "status: Failed" in broken.stderr, broken.stderr
    assert "fc-shape" in broken.stderr
    assert "deadline exceeded" not in broken.stderr


@pytest.mark.cluster
def test_the_documented_flux_kustomization_is_accepted_by_fluxs_own_crd(cluster: Cluster, bin_dir: Path) -> None:
    """The Kustomization in docs/operations/gitops.md, dry-run on the server against kustomize-controller's CRD
    (hack/build-kube takes it from the module); running kustomize-controller is out of scope."""
    cluster.kubectl("apply", "--server-side", "-f", str(bin_dir / "flux-kustomizations-crd.yaml"))
    cluster.kubectl("wait", "--for=condition=Established", "crd/kustomizations.kustomize.toolkit.fluxcd.io",
                    "--timeout=60s")  # fmt: skip
    text = (REPO / "docs" / "operations" / "gitops.md").read_text()
    blocks = [yaml.safe_load(b.split("```")[0]) for b in text.split("```yaml\n")[1:]]
    (documented,) = [b for b in blocks if b.get("apiVersion", "").startswith("kustomize.toolkit.fluxcd.io/")]
    assert documented["spec"]["wait"] is True
    if cluster.kubectl("get", "namespace", "flux-system", check=False).returncode != 0:
        cluster.kubectl("create", "namespace", "flux-system")

    def dry_run(obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(obj), check=False)

    accepted = dry_run(documented)
    assert accepted.returncode == 0, accepted.stderr
    # the schema is enforced: the same with `wait` misspelt as a string is refused, naming the field
    refused = dry_run({**documented, "spec": {**documented["spec"], "wait": "yes"}})
    assert refused.returncode != 0
    assert "spec.wait" in refused.stderr


@pytest.mark.cluster
def test_live_train_jobs_as_flux_helm_and_argocd_see_them(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, workspace: Any,
    bin_dir: Path,
) -> None:  # fmt: skip
    """A run while a stage runs (Current, as kstatus treats a started Job; Argo CD Progressing), once it succeeded
    (Current, Healthy) and one whose stage failed (Failed, Degraded), through kstatus and the Argo CD script."""
    workspace("slow-workspace")
    workspace("broken-workspace")
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=slow_offline("slow", store, creds, "2s"))
    broken = stj("broken", store, creds, retries=0, data={"sources": [store["data"]], "format": "pretokenized"},
                 stages={"cpu": simulated(), "trainer": simulated(**{"speculators.dev/simulate": "fail"})})  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=broken)
    script = str(SCRIPTS / KINDS[1] / "health.lua")

    def running() -> dict[str, Any]:
        obj = get(cluster, namespace, "stj/slow")
        st = obj["status"]
        assert st.get("phase") not in (None, "Pending", "Succeeded"), st.get("phase")
        assert any(s.get("startTime") for s in st.get("stages") or []), "no stage started yet"
        return obj  # type: ignore[no-any-return]

    mid = eventually(running, timeout=120)
    assert "Ready" not in {c["type"] for c in mid["status"]["conditions"]}
    assert gitops(bin_dir, "kstatus", objects=[mid])[0]["status"] == "Current"
    assert gitops(bin_dir, "health", script, objects=[mid])[0]["status"] == "Progressing"

    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "stj/slow", "--timeout=300s")
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Stalled", "stj/broken", "--timeout=300s")
    done = [get(cluster, namespace, f"stj/{name}") for name in ("slow", "broken")]
    assert [k["status"] for k in gitops(bin_dir, "kstatus", objects=done)] == ["Current", "Failed"]
    said = gitops(bin_dir, "health", script, objects=done)
    assert [a["status"] for a in said] == ["Healthy", "Degraded"]
    assert said[1]["message"].startswith("StageFailed")


@pytest.mark.cluster
def test_the_other_rows_live_a_stuck_rollout_waiting_inputs_an_invalid_spec_and_no_retrain_template(
    cluster: Cluster, operator: KopfRunner, store: dict[str, str], namespace: str, creds: str, bin_dir: Path
) -> None:
    """The table's rows the other live tests do not reach, each held in its state on the real control plane."""
    assert cluster.s3 is not None
    s3 = cluster.s3.client()
    bucket = store["verifier"].removeprefix("s3://").split("/")[0]
    # rolling out, held there: its pods fit no node (Reconciling with the scheduler's reason)
    nowhere = json.loads(sdep("nowhere", store, "good", creds, nodeSelector={"speculators.dev/no-such-node": "x"}))
    # pending on a train job that does not exist yet
    following = json.loads(sdep("following", store, "good", creds))
    following["spec"]["speculator"] = {"fromTrainJob": "not-yet"}
    # mtp on a verifier without native MTP layers (qwen3): InvalidSpec before any pod
    refused = json.loads(stj("mtp", store, creds, algorithm="mtp"))
    # Retrain without a template, once the verifier moves: RetrainUnavailable while the pair serves
    verifier = f"v-{namespace}-untemplated"
    s3.put_object(Bucket=bucket, Key=f"{verifier}/config.json", Body=json.dumps(SMALL).encode())
    untemplated = json.loads(sdep("untemplated", {**store, "verifier": f"s3://{bucket}/{verifier}"}, "good", creds))
    untemplated["spec"]["upgradePolicy"] = {"onVerifierChange": "Retrain", "pollIntervalSeconds": 3600}
    # a train job whose verifier cannot be read: before its first stage, waiting on an input
    blind = json.loads(stj("blind", {**store, "verifier": f"s3://{bucket}/no-such-verifier-{namespace}"}, creds))
    for doc in (nowhere, following, refused, untemplated, blind):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/untemplated", "--timeout=120s")
    s3.put_object(Bucket=bucket, Key=f"{verifier}/config.json",
                  Body=json.dumps({**SMALL, "rope_theta": 1000000}).encode())  # fmt: skip
    cluster.kubectl("annotate", "-n", namespace, "sdep/untemplated", "speculators.dev/resolve-requested=now")

    expected = {  # name: (kind, condition that is True, kstatus, Argo CD)
        "nowhere": ("sdep", "Reconciling", "InProgress", "Progressing"),
        "following": ("sdep", "Reconciling", "InProgress", "Progressing"),
        "mtp": ("stj", "Stalled", "Failed", "Degraded"),
        "untemplated": ("sdep", "Stalled", "Failed", "Degraded"),
        "blind": ("stj", "Reconciling", "InProgress", "Progressing"),
    }
    for name, (kind, condition, _, _) in expected.items():
        cluster.kubectl("wait", "-n", namespace, f"--for=condition={condition}", f"{kind}/{name}", "--timeout=120s")
    objects = {name: get(cluster, namespace, f"{kind}/{name}") for name, (kind, *_) in expected.items()}
    reasons = {
        name: {c["type"]: c["reason"] for c in obj["status"]["conditions"]}[expected[name][1]]
        for name, obj in objects.items()
    }
    assert reasons == {"nowhere": "Unschedulable", "following": "TrainJobPending", "mtp": "InvalidSpec",
                       "untemplated": "RetrainUnavailable", "blind": "VerifierUnreadable"}  # fmt: skip
    for name, obj in objects.items():
        kind = KINDS[0] if expected[name][0] == "sdep" else KINDS[1]
        (said,) = gitops(bin_dir, "kstatus", objects=[obj])
        (health,) = gitops(bin_dir, "health", str(SCRIPTS / kind / "health.lua"), objects=[obj])
        assert (said["status"], health["status"]) == expected[name][2:], name
