"""Parallel layouts and multi-node servers (docs/reference/parallelism.md): the layout, the release's refusals, the
LeaderWorkerSet group, the planner's answers without the LWS API, the entrypoint's refusal of missing variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.api.deployment import SpeculatorDeploymentSpec, SpeculatorDeploymentStatus
from speculator_operator.api.labels import LWS_GROUP_KEY_LABEL, REVISION_LABEL, ROLE_LABEL
from speculator_operator.api.parallelism import Parallelism, layout
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.parallelism import Layout
from speculator_operator.domain.releases import get_release
from speculator_operator.planning.deployment import Observed, plan, serving_status
from speculator_operator.planning.health import deployment_health
from speculator_operator.planning.inputs import ServingReason
from speculator_operator.planning.pods import START_REFUSED, pod_problem
from speculator_operator.planning.watched import scraped, trimmed_pod
from speculator_operator.pods import serve
from speculator_operator.render import group, serving, training
from speculator_operator.render.serving import Draft, Inputs, RenderError, render

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint
from ..clock import NOW


def spec(**serving_: Any) -> SpeculatorDeploymentSpec:
    return SpeculatorDeploymentSpec.model_validate(
        {
            "verifier": {"model": "Qwen/Qwen3-8B", "revision": "main"},
            "speculator": {"source": "hf://acme/d"},
            "serving": serving_,
        }
    )


def rendered(algo: str = "eagle3", **serving_: Any) -> serving.Rendered:
    return render(Inputs("q", "ns", spec(**serving_), get_release(), Draft(algo, 3, "d" * 40), "v" * 40, "uid"))


def by_kind(r: serving.Rendered) -> dict[str, dict[str, Any]]:
    return {c["kind"]: c for c in r.children}


def main_container(template: dict[str, Any]) -> dict[str, Any]:
    return template["spec"]["containers"][0]  # type: ignore[no-any-return]


def test_the_layout_resolves_tensor_from_either_field() -> None:
    assert layout(None, 4) == Layout(tensor=4)
    assert layout(Parallelism(nodes=2), 8) == Layout(tensor=8, nodes=2)
    assert layout(Parallelism(tensor=4, pipeline=2, data=2, nodes=2), 1).gpus_per_pod == 8
    assert Layout(tensor=3, nodes=2).problem() is not None  # 3 GPUs cannot be halved
    assert Layout(tensor=2, data=3, nodes=2).problem() is not None  # 3 data ranks over 2 nodes
    assert Layout(tensor=4, data=2, nodes=2).problem() is None


def test_two_nodes_two_replicas_render_one_leader_worker_set() -> None:
    r = rendered(replicas=2, parallelism={"tensor": 8, "nodes": 2})
    kinds = by_kind(r)
    assert sorted(kinds) == ["LeaderWorkerSet", "PodDisruptionBudget", "Service"]
    lws = kinds["LeaderWorkerSet"]
    assert lws["metadata"]["name"] == "q-group"  # the LWS controller's headless Service takes the set's name
    assert lws["spec"]["replicas"] == 2
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = main_container(template["leaderTemplate"]), main_container(template["workerTemplate"])
    port = ["--master-port", str(29501 + int(r.revision, 16) % 1000)]  # one rendezvous per revision
    assert leader["args"][-2:] == worker["args"][-2:] == port
    assert leader["args"][-10:-2] == [
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--distributed-executor-backend",
        "mp",
    ]
    assert worker["args"][-11:-2] == [
        "--nnodes",
        "2",
        "--node-rank",
        "$(LWS_WORKER_INDEX)",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--distributed-executor-backend",
        "mp",
        "--headless",
    ]
    assert leader["args"][:-10] == worker["args"][:-11]  # the same engine arguments on every rank
    assert "readinessProbe" in leader
    assert "livenessProbe" in leader
    assert not {"ports", "readinessProbe", "livenessProbe", "startupProbe"} & set(worker)
    # each pod stages and audits the draft itself, and holds a GPU share of the group
    for tmpl in (template["leaderTemplate"], template["workerTemplate"]):
        assert [c["name"] for c in tmpl["spec"]["initContainers"]] == ["stage-draft"]
        assert main_container(tmpl)["command"][:2] == ["speculator-operator", "serve"]
        assert main_container(tmpl)["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert template["leaderTemplate"]["metadata"]["labels"][ROLE_LABEL] == "leader"
    assert template["workerTemplate"]["metadata"]["labels"][ROLE_LABEL] == "worker"
    assert kinds["Service"]["spec"]["selector"][ROLE_LABEL] == "leader"
    assert ROLE_LABEL not in kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"]


def test_one_node_renders_the_deployment_as_before_and_nodes_move_the_revision() -> None:
    one = rendered(tensorParallelSize=4)
    same = rendered(parallelism={"tensor": 4})
    assert one.children == same.children
    assert one.revision == same.revision
    assert [c["kind"] for c in one.children] == ["Deployment", "Service", "PodDisruptionBudget"]
    assert "--nnodes" not in one.vllm_args
    assert "--pipeline-parallel-size" not in one.vllm_args
    two = rendered(parallelism={"tensor": 4, "nodes": 2})
    assert two.revision != one.revision


@pytest.mark.parametrize(
    ("algo", "parallelism", "words"),
    [
        ("peagle", {"pipeline": 2}, "pipeline parallelism"),
        ("eagle3", {"tensor": 8, "nodes": 4}, "maxNodes"),
        ("eagle3", {"tensor": 3, "nodes": 2}, "do not divide"),
    ],
)
def test_a_layout_the_release_cannot_serve_is_refused_before_any_child(
    algo: str, parallelism: dict[str, Any], words: str
) -> None:
    with pytest.raises(RenderError) as refused:
        rendered(algo, parallelism=parallelism)
    assert refused.value.reason == ServingReason.LAYOUT_UNSUPPORTED == serving.LAYOUT_UNSUPPORTED
    assert words in str(refused.value)
    # eagle3 pipelines in 0.32's Model Runner V2: the same layout is served
    assert rendered("eagle3", parallelism={"pipeline": 2}).vllm_args.count("--pipeline-parallel-size") == 1


def test_data_parallelism_renders_no_schedule_and_says_why() -> None:
    r = rendered(parallelism={"data": 2}, cutoff={"maxBatchSize": 32})
    config = json.loads(r.vllm_args[r.vllm_args.index("--speculative-config") + 1])
    assert "num_speculative_tokens_per_batch_size" not in config
    assert [reason for reason, _ in r.notes] == [serving.SCHEDULE_OFF]
    plain = rendered(cutoff={"maxBatchSize": 32})
    assert "num_speculative_tokens_per_batch_size" in plain.vllm_args[plain.vllm_args.index("--speculative-config") + 1]


@pytest.fixture
def good(tmp_path: Path) -> Any:
    write_checkpoint(tmp_path / "good", *eagle3())
    return audit(str(tmp_path / "good"), verifier=QWEN3_8B, release=get_release())


OLD_DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "q"}}


def group_pods(group_key: str, *revisions: str | None) -> list[dict[str, Any]]:
    """The pods of one group, by worker index, each at its revision."""
    return [
        {"metadata": {"name": f"{group_key}-{i}", "labels": {LWS_GROUP_KEY_LABEL: group_key, REVISION_LABEL: rev}}}
        for i, rev in enumerate(revisions)
    ]


def test_without_the_lws_api_nothing_is_created_and_the_object_is_stalled(good: Any) -> None:
    two = spec(parallelism={"tensor": 2, "nodes": 2})

    def planned(status: SpeculatorDeploymentStatus, **observed: Any) -> Any:
        return plan("q", "ns", "uid", two, get_release(), Observed(3, status, "v1", good, **observed), now=NOW)

    p = planned(SpeculatorDeploymentStatus(), lws_served=False)
    assert p.children is None
    assert p.status.phase == "Failed"
    ready = next(c for c in p.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", ServingReason.LWS_UNAVAILABLE)
    assert "LeaderWorkerSet" in ready.message
    assert "install" in ready.message
    stalled = next(c for c in deployment_health(p.status, now=NOW).conditions if c.type == "Stalled")
    assert stalled.reason == ServingReason.LWS_UNAVAILABLE
    # a single-node pair still serving keeps serving (Degraded) and is still Stalled
    kept = planned(SpeculatorDeploymentStatus(), lws_served=False, other=OLD_DEPLOYMENT)
    assert kept.status.phase == "Degraded"
    assert kept.children is None
    assert any(c.type == "Stalled" for c in deployment_health(kept.status, now=NOW).conditions)
    # with the API: a group, and the Deployment of the old layout deleted only once the group is ready
    served = planned(SpeculatorDeploymentStatus(), lws_served=True, other=OLD_DEPLOYMENT)
    assert next(c["kind"] for c in served.children or []) == "LeaderWorkerSet"
    assert served.prune == []
    lws = {
        "kind": group.KIND,
        "metadata": {"generation": 1, "annotations": {"speculators.dev/revision": served.status.revision}},
        "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1},
    }
    whole = group_pods("g0", served.status.revision, served.status.revision)
    done = planned(served.status, child=lws, lws_served=True, other=OLD_DEPLOYMENT, pods=whole)
    assert done.status.phase == "Ready"
    assert done.prune == [("apps/v1", "Deployment", "q")]
    assert done.events[-1][:2] == ("Normal", "LayoutChanged")


def test_a_group_is_rolled_out_when_every_group_is_ready_at_the_new_revision() -> None:
    two = spec(replicas=2, parallelism={"tensor": 2, "nodes": 2})

    def lws(revision: str, ready: int, updated: int) -> dict[str, Any]:
        return {
            "kind": group.KIND,
            "metadata": {"generation": 2, "annotations": {"speculators.dev/revision": revision}},
            "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": ready, "updatedReplicas": updated},
        }

    whole = group_pods("g0", "r2", "r2") + group_pods("g1", "r2", "r2")
    assert serving_status(two, "r2", lws("r2", 2, 2), whole).ready is True
    assert serving_status(two, "r2", lws("r2", 2, 1), whole).ready is False  # one group still at the old template
    assert serving_status(two, "r2", lws("r2", 1, 2), whole).ready is False
    assert serving_status(two, "r2", lws("r1", 2, 2), whole).updated_replicas == 0  # not the revision asked for
    # the LeaderWorkerSet counts a group updated once its leader is; the operator counts whole groups only
    leader_first = group_pods("g0", "r2", "r2") + group_pods("g1", "r2", "r1")
    assert serving_status(two, "r2", lws("r2", 2, 2), leader_first).updated_replicas == 1
    assert serving_status(two, "r2", lws("r2", 2, 2), leader_first).ready is False
    workers_missing = group_pods("g0", "r2", "r2") + group_pods("g1", "r2")
    assert serving_status(two, "r2", lws("r2", 2, 2), workers_missing).ready is False
    assert serving_status(two, "r2", lws("r2", 2, 2)).ready is False  # pods unknown: nothing counts as whole
    # the watch's trimmed pods keep what this reads
    assert serving_status(two, "r2", lws("r2", 2, 2), [trimmed_pod(p) for p in whole]).ready is True
    # the surge group rolled in beside them is whole too, but only the wanted groups count: the count does not go
    # stale when the surge group goes (a drop of updatedReplicas alone writes no status)
    surge = whole + group_pods("g2", "r2", "r2")
    assert serving_status(two, "r2", lws("r2", 3, 3), surge).updated_replicas == 2


def test_the_scrape_skips_headless_workers() -> None:
    leader = {"metadata": {"name": "q-group-0", "labels": {ROLE_LABEL: "leader", "speculators.dev/revision": "r"}}}
    worker = {"metadata": {"name": "q-group-0-1", "labels": {ROLE_LABEL: "worker", "speculators.dev/revision": "r"}}}
    single = {"metadata": {"name": "q-abc", "labels": {"speculators.dev/revision": "r"}}}
    assert [scraped(trimmed_pod(p)) for p in (leader, worker, single)] == [True, False, True]


def test_a_rank_without_its_group_variables_refuses_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = [
        "serve",
        "/m",
        "--nnodes",
        "2",
        "--node-rank",
        "$(LWS_WORKER_INDEX)",
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
    ]
    why = serve.unexpanded(args)
    assert why is not None
    assert "LWS_LEADER_ADDRESS, LWS_WORKER_INDEX not set" in why
    assert serve.unexpanded(["serve", "/m", "--nnodes", "2", "--node-rank", "1", "--master-addr", "q-0.q.ns"]) is None
    log = tmp_path / "termination-log"
    monkeypatch.setattr(serve, "REPORT_PATH_DEFAULT", str(log))
    assert serve.exec_vllm(args) == 2  # ExitCode.USAGE, before any exec
    assert "LeaderWorkerSet pod webhook" in log.read_text()
    # the pod's status then says it, even though the group is recreated before any CrashLoopBackOff
    pod = {
        "metadata": {"name": "q-group-0-1"},
        "status": {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "state": {"terminated": {"reason": "Error", "exitCode": 2, "message": log.read_text()}},
                }
            ]
        },
    }
    reason, message = pod_problem(trimmed_pod(pod)) or ("", "")
    assert reason == START_REFUSED
    assert "LWS_LEADER_ADDRESS" in message


def test_an_extraction_server_larger_than_one_node_is_a_group_with_the_connector_on_every_rank() -> None:
    parsed = SpeculatorTrainJobSpec.model_validate(
        {
            "verifier": {"model": "Qwen/Qwen3-8B"},
            "algorithm": "eagle3",
            "data": {"sources": ["hf:HuggingFaceH4/ultrachat_200k"]},
            "output": {"uri": "s3://drafts/q"},
            "hiddenStates": {"backend": "fp8", "replicas": 2, "tensorParallelSize": 8, "parallelism": {"nodes": 2}},
        }
    )
    inputs = training.Inputs("run", "ml", parsed, get_release(), "abc", 36, "uid", verifier_content="s3:v")
    children = training.hidden_states.server(inputs, "extractor")
    lws, svc = children
    assert lws["kind"] == group.KIND
    assert lws["spec"]["replicas"] == 2
    assert svc["spec"]["selector"][ROLE_LABEL] == "leader"
    assert svc["metadata"]["name"] == "run-extractor"
    template = lws["spec"]["leaderWorkerTemplate"]
    for tmpl in (template["leaderTemplate"], template["workerTemplate"]):
        args = main_container(tmpl)["args"]
        kv = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert kv["kv_connector"] == "FP8HiddenStatesConnector"
        assert main_container(tmpl)["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert "--headless" in main_container(template["workerTemplate"])["args"]


def test_a_train_job_whose_server_needs_a_group_waits_stalled_without_the_lws_api() -> None:
    from speculator_operator.api.trainjob import SpeculatorTrainJobStatus
    from speculator_operator.planning import trainjob
    from speculator_operator.planning.health import trainjob_health

    parsed = SpeculatorTrainJobSpec.model_validate(
        {
            "verifier": {"model": "Qwen/Qwen3-8B"},
            "algorithm": "eagle3",
            "data": {"sources": ["hf:org/chats"], "format": "pretokenized"},
            "output": {"uri": "s3://drafts/q"},
            "hiddenStates": {"tensorParallelSize": 8, "parallelism": {"nodes": 2}},
        }
    )
    done = {
        "status": {
            "conditions": [{"type": "Complete", "status": "True"}],
            "startTime": "2026-11-29T10:00:00Z",
            "completionTime": "2026-11-29T10:01:00Z",
        }
    }

    def at_extract(served: bool) -> trainjob.Plan:
        obs = trainjob.Observed(
            generation=1,
            status=SpeculatorTrainJobStatus(),
            verifier_layers=36,
            verifier_revision="sha1",
            verifier_model_type="qwen3",
            jobs={"fetch": done, "prepare": done},
            lws_served=served,
        )
        return trainjob.plan("q", "ml", "uid", parsed, get_release(), obs, now=NOW)

    waiting = at_extract(False)
    assert waiting.apply == []  # neither the server nor the extraction Job
    failed = next(c for c in waiting.status.conditions if c.type == "Failed")
    assert (failed.status, failed.reason) == ("False", ServingReason.LWS_UNAVAILABLE)
    assert (
        next(c for c in trainjob_health(waiting.status, now=NOW).conditions if c.type == "Stalled").reason
        == failed.reason
    )
    running = at_extract(True)
    assert [c["kind"] for c in running.apply] == ["LeaderWorkerSet", "Service"]


def test_the_cpu_launcher_refuses_a_headless_rank_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "termination-log"
    monkeypatch.setattr(serve, "REPORT_PATH_DEFAULT", str(log))
    monkeypatch.setenv(serve.LAUNCHER_ENV, "api-server")
    assert serve.exec_vllm(["serve", "/m", "--nnodes", "2", "--node-rank", "1", "--headless"]) == 2
    assert "cannot run a headless rank" in log.read_text()


def test_a_rolling_group_is_read_again_and_a_layout_change_ends_when_ready() -> None:
    from speculator_operator.planning.deployment import group_poll_due, layout_change_done

    deploying, ready = SpeculatorDeploymentStatus(phase="Deploying"), SpeculatorDeploymentStatus(phase="Ready")
    assert group_poll_due(spec(parallelism={"tensor": 2, "nodes": 2}), deploying)
    assert not group_poll_due(spec(parallelism={"tensor": 2, "nodes": 2}), ready)
    assert not group_poll_due(spec(), deploying)  # a Deployment's watch brings its changes
    assert layout_change_done(deploying, ready)
    assert not layout_change_done(ready, ready)
    assert not layout_change_done(deploying, deploying)
