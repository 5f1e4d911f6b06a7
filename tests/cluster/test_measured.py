"""A draft published with a measured sweep (the real publish, into the real S3 server), served on the real control
plane: on the device class the sweep ran on (GPU feature discovery's label on the stand-in node) the deployment renders
the curve's schedule; on another it keeps the model and says so; live step times from scripted vLLM metrics
(standin.py) move predictedSpeedup once they change, and a steady window writes nothing (material changes only)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import read_verifier
from speculator_operator.domain.economics import draft_forwards, speedup
from speculator_operator.domain.releases import get_release
from speculator_operator.domain.sweep import PLAIN, Curve, Point, choose
from speculator_operator.pods.trainer.publish import publish

from ..ckptgen import SMALL_QWEN3 as SMALL
from ..ckptgen import eagle3, write_checkpoint
from .conftest import Cluster, eventually, get, sdep, stj
from .standin import standin_node  # noqa: F401  (a fixture)
from .test_tuning import close, fakes_for, operator_in, served_config, status

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("operator_crds", "standin_node")]

DEVICE = "NVIDIA H100 80GB HBM3"  # what CUDA calls the stand-in node's NVIDIA-H100-80GB-HBM3
RATES = {
    3: {1: 30, 2: 55, 4: 80, 8: 100, 16: 60, 32: 80},
    2: {1: 25, 2: 50, 4: 90, 8: 120, 16: 90, 32: 120},
    PLAIN: {1: 10, 2: 20, 4: 40, 8: 80, 16: 160, 32: 320},
}
ITL = {3: 14.0, 2: 12.0, PLAIN: 10.0}  # ms at every concurrency: plain decoding's step is 10 ms
CURVE = Curve(
    "nvidia-h100-80gb-hbm3",
    (3, 2),
    (1, 2, 4, 8, 16, 32),
    tuple(
        Point(k, c, 2 * c, rate * 10, 10.0, itl_ms=ITL[k], running=float(c))
        for k, row in RATES.items()
        for c, rate in row.items()
    ),
)


@pytest.fixture(scope="module")
def swept(cluster: Cluster, store: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The store's draft published by the trainer's own publish, with the sweep in its provenance record."""
    assert cluster.s3 is not None
    env = cluster.s3.env()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        root = tmp_path_factory.mktemp("swept")
        write_checkpoint(root / "draft", *eagle3(SMALL, draft_vocab=1024), sparse=False)
        ref = read_verifier(store["verifier"], env)
        report = root / "publish.report"
        mp.setenv("SPECULATOR_REPORT_PATH", str(report))
        evaluation = {"outcome": "Passed", "k": 3, "sweep": CURVE.summary()}
        bucket = store["good"].removeprefix("s3://").split("/")[0]
        code = publish(str(root / "draft"), f"s3://{bucket}/swept", store["verifier"], ref.revision or "",
                       "ml/train-swept", get_release().name, verifier_content=ref.content, evaluation=evaluation,
                       sweep=CURVE.wire())  # fmt: skip
        assert code == 0
        return str(json.loads(report.read_text())["uri"])


def serving(**more: Any) -> dict[str, Any]:
    return {
        "replicas": 1,
        "nodeSelector": {"speculators.dev/standin": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "maxNumSeqs": 64,
        "tuning": {"minSamples": 100, "windowSeconds": 30},
        **more,
    }


def test_the_measured_schedule_is_served_on_its_device_class_and_the_model_elsewhere(
    cluster: Cluster, store: dict[str, str], namespace: str, creds: str, swept: str
) -> None:
    with operator_in(cluster, namespace):
        for name, more in (("here", {}), ("elsewhere", {"deviceClass": "NVIDIA H200"})):
            body = json.loads(sdep(name, {**store, "swept": swept}, "swept", creds, **serving(**more)))
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))
        for name in ("here", "elsewhere"):
            cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"sdep/{name}", "--timeout=120s")
        choice = choose(CURVE, 64, 3, get_release().schedule_cost)
        assert choice.schedule is not None  # this curve pays for a schedule
        config = served_config(cluster, namespace, "here")
        assert config is not None
        assert config["num_speculative_tokens"] == choice.k
        assert config["num_speculative_tokens_per_batch_size"] == choice.schedule.as_list()
        econ = status(cluster, namespace, "here")["economics"]
        assert (econ["source"], econ["scheduleFrom"]) == ("sweep", "sweep")
        assert econ["sweep"] == {"job": "ml/train-swept", "device": CURVE.device, "digest": CURVE.digest()}
        assert econ["plainSteps"][0] == [1.0, 10.0]

        config = served_config(cluster, namespace, "elsewhere")
        assert config is not None
        assert "num_speculative_tokens_per_batch_size" not in config
        econ = status(cluster, namespace, "elsewhere")["economics"]
        assert (econ["source"], econ["scheduleFrom"]) == ("prior", "checkpoint")  # the device class prior stands
        assert econ["prior"] == "h200"  # deviceClass NVIDIA H200 keys the prior
        assert f"ran on {CURVE.device}" in econ["note"]


def test_live_step_times_move_the_predicted_speedup_without_a_write_storm(
    cluster: Cluster, store: dict[str, str], namespace: str, creds: str, swept: str
) -> None:
    with operator_in(cluster, namespace):
        body = sdep("live", {**store, "swept": swept}, "swept", creds, **serving(numSpeculativeTokens=3))
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=body)
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "sdep/live", "--timeout=120s")
        (fake,) = fakes_for(cluster, namespace, "live", 3, "alpha", 0.7)
        fake.step_ms, fake.batch = 14.0, 1.0
        try:

            def live(step_ms: float) -> dict[str, Any]:
                st = status(cluster, namespace, "live")
                acc = st.get("acceptance") or {}
                assert acc.get("costSource") == "live", acc
                assert acc.get("stepMs") == pytest.approx(step_ms, abs=0.01), acc
                assert st["economics"]["source"] == "live", st["economics"]
                return st

            first = eventually(lambda: live(14.0), timeout=90)
            acc = first["acceptance"]
            cost = (14.0 / 10.0 - 1) / draft_forwards("eagle3", 3)  # against plain's 10 ms at batch 1
            assert acc["costRatio"] == pytest.approx(cost, abs=1e-3)
            assert acc["predictedSpeedup"] == pytest.approx(speedup(acc["alpha"], 3, cost), abs=0.01)
            # a steady window: the scrapes go on, nothing is written
            version = get(cluster, namespace, "sdep/live")["metadata"]["resourceVersion"]
            marks = fake.scrapes
            eventually(lambda: _at_least(fake.scrapes - marks, 10), timeout=60)
            assert get(cluster, namespace, "sdep/live")["metadata"]["resourceVersion"] == version
            # slower steps: the same acceptance predicts less
            fake.step_ms = 20.0
            slower = eventually(lambda: live(20.0), timeout=90)
            assert slower["acceptance"]["predictedSpeedup"] < acc["predictedSpeedup"]
            assert slower["economics"]["effectiveCostRatio"] == pytest.approx((20.0 / 10.0 - 1) / 3, abs=1e-3)
        finally:
            close([fake])


def _at_least(n: int, wanted: int) -> None:
    assert n >= wanted, f"{n} scrapes, waiting for {wanted}"


def test_a_train_job_with_a_sweep_runs_one_server_per_k_and_publishes_the_curve(
    cluster: Cluster, store: dict[str, str], namespace: str, creds: str, workspace: Any
) -> None:
    """The stage machine on the real control plane; kwok completes the stage pods with the reports the real client
    writes (the workloads tier runs that client against real vLLM)."""
    from .test_trainjob_controller import REPORT, api_calls

    workspace("swept-workspace")

    def said(report: dict[str, Any]) -> str:
        return json.dumps({"speculatorsReport": 1, **report})

    reports = {
        "speculators.dev/simulate-message": json.dumps(REPORT),
        "speculators.dev/simulate-message-evaluate": said(
            {"stage": "evaluate", "evaluation": {"outcome": "Passed", "k": 3, "drafts": 40, "rate": 0.7}}
        ),
    }
    for stage, label, k in (("sweep-k", "k", 3), ("sweep-half", "half", 2), ("sweep-plain", "plain", PLAIN)):
        points = [p.wire() for p in CURVE.points if p.k == k]
        reports[f"speculators.dev/simulate-message-{stage}"] = said(
            {"stage": "sweep", "sweep": {"label": label, "k": k, "device": DEVICE, "points": points}}
        )
    cpu = {"annotations": reports}
    manifest = stj(
        "swept", store, creds,
        data={"sources": [store["data"]], "format": "pretokenized"},
        evaluation={"heldOut": 8, "sweep": {"maxConcurrency": 8, "rounds": 1}},
        stages={"cpu": cpu, "trainer": {"annotations": {"speculators.dev/simulate-message": json.dumps(REPORT)}}},
    )  # fmt: skip
    with operator_in(cluster, namespace):
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", "stj/swept", "--timeout=240s", timeout=260)
    st = get(cluster, namespace, "stj/swept")["status"]
    assert st["phase"] == "Succeeded"
    names = [s["name"] for s in st["stages"]]
    assert names[-5:] == ["evaluate", "sweep-k", "sweep-half", "sweep-plain", "publish"]
    summary = st["evaluation"]["sweep"]
    assert summary["digest"] == CURVE.digest()
    assert summary["device"] == CURVE.device
    assert summary["crossover"] == 16
    assert st["provenance"]["evaluation"]["sweep"] == summary
    publish = json.loads(cluster.kubectl("get", "-n", namespace, "job/swept-publish", "-o", "json").stdout)
    args = publish["spec"]["template"]["spec"]["containers"][0]["args"]
    assert Curve.from_wire(json.loads(args[args.index("--sweep") + 1])) == CURVE  # the whole curve, for the record
    # one server per K, one after another: each client only once its server was there, the last gone before the next
    first: dict[tuple[str, str, str], str] = {}
    for t, verb, resource, name in api_calls(cluster, namespace):
        first.setdefault((verb, resource, name), t)
    job, deployment = "jobs", "deployments"
    assert first[("patch", deployment, "swept-evaluator")] < first[("patch", job, "swept-evaluate")]
    assert first[("patch", job, "swept-sweep-k")] < first[("delete", deployment, "swept-evaluator")]
    assert first[("patch", deployment, "swept-sweeper-half")] < first[("patch", job, "swept-sweep-half")]
    assert first[("delete", deployment, "swept-evaluator")] < first[("patch", job, "swept-sweep-half")]
    assert first[("delete", deployment, "swept-sweeper-half")] < first[("patch", job, "swept-sweep-plain")]
    assert first[("patch", deployment, "swept-sweeper-plain")] < first[("patch", job, "swept-sweep-plain")]
    assert first[("patch", job, "swept-sweep-plain")] < first[("delete", deployment, "swept-sweeper-plain")]
