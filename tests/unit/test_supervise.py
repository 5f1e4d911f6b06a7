"""The server entrypoint runs vLLM as its child and leaves a reasoned exit record when vLLM fails
(pods/supervise.py), and the operator reads that record's reason from the pod (planning/pods.py). Here vLLM is a
small script and its interpreter a stand-in that answers the platform probe; tests/workloads runs the real CPU
build through the same path, and the node tier the cpu server image through the operator."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from speculator_operator.api.podcontract import (
    REPORT_LIMIT,
    REPORT_PATH_ENV,
    ServerExit,
    ServerExitReason,
    StageReport,
)
from speculator_operator.planning.deployment import serving_status
from speculator_operator.planning.pods import MAX_MESSAGE, pod_problem
from speculator_operator.pods.supervise import classify, probe_platform, supervise


def script(path: Path, body: str) -> str:
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def platform_answer(tmp_path: Path, device_type: str | None) -> str:
    """An interpreter that answers vLLM's platform probe with `device_type` (None: it cannot say)."""
    said = "" if device_type is None else f"echo speculator-platform={device_type}"
    return script(tmp_path / "python", f"#!/bin/sh\necho importing\n{said}\n")


FAILING_VLLM = """#!/bin/sh
echo "INFO starting the engine"
echo "Traceback (most recent call last):" >&2
echo "RuntimeError: Failed to infer device type" >&2
exit 3
"""


def run(tmp_path: Path, vllm: str, device_type: str | None) -> tuple[int, ServerExit | None, bytes, bytes]:
    record = tmp_path / "termination-log"
    out, err = io.BytesIO(), io.BytesIO()
    code = supervise([vllm], platform_answer(tmp_path, device_type), out, err, str(record))
    found = ServerExit.decode(record.read_text()) if record.exists() else None
    return code, found, out.getvalue(), err.getvalue()


def test_a_vllm_that_finds_no_device_leaves_no_accelerator_with_its_output(tmp_path: Path) -> None:
    code, record, out, err = run(tmp_path, script(tmp_path / "vllm", FAILING_VLLM), "")
    assert code == 3
    assert record is not None
    assert record.reason is ServerExitReason.NO_ACCELERATOR
    assert (record.exit_code, record.platform) == (3, "")
    # the output still reaches the pod's log, each stream on its own, and the tail of both is in the record, each
    # stream's lines in their order (the two streams' lines interleave as they arrive)
    assert out == b"INFO starting the engine\n"
    assert err == b"Traceback (most recent call last):\nRuntimeError: Failed to infer device type\n"
    said = record.message.splitlines()
    assert "INFO starting the engine" in said
    assert said.index("Traceback (most recent call last):") < said.index("RuntimeError: Failed to infer device type")


def test_a_vllm_that_fails_on_a_platform_it_has_leaves_engine_exited(tmp_path: Path) -> None:
    code, record, _, _ = run(tmp_path, script(tmp_path / "vllm", FAILING_VLLM), "cpu")
    assert code == 3
    assert record is not None
    assert (record.reason, record.platform) == (ServerExitReason.ENGINE_EXITED, "cpu")


def test_a_platform_that_cannot_be_asked_is_not_taken_for_no_device(tmp_path: Path) -> None:
    _, record, _, _ = run(tmp_path, script(tmp_path / "vllm", FAILING_VLLM), None)
    assert record is not None
    assert (record.reason, record.platform) == (ServerExitReason.ENGINE_EXITED, None)
    assert probe_platform(str(tmp_path / "no-such-python"), dict(os.environ)) is None


def test_a_clean_exit_leaves_no_record(tmp_path: Path) -> None:
    code, record, out, _ = run(tmp_path, script(tmp_path / "vllm", "#!/bin/sh\necho bye\nexit 0\n"), "")
    assert (code, record, out) == (0, None, b"bye\n")


def test_a_vllm_killed_by_a_signal_exits_as_a_shell_would(tmp_path: Path) -> None:
    code, record, _, _ = run(tmp_path, script(tmp_path / "vllm", "#!/bin/sh\nkill -9 $$\n"), "cuda")
    assert code == 128 + signal.SIGKILL
    assert record is not None
    assert (record.reason, record.exit_code) == (ServerExitReason.ENGINE_EXITED, 137)


def test_the_kubelets_sigterm_reaches_vllm_and_a_stop_it_asked_for_leaves_no_record(tmp_path: Path) -> None:
    """The entrypoint is the container's first process: the kubelet's SIGTERM goes to it, and vLLM must get it
    (its graceful shutdown). A stop that was asked for is no failure, whatever vLLM's status."""
    got = tmp_path / "got"
    vllm = script(tmp_path / "vllm", f"#!/bin/sh\ntrap 'echo TERM > {got}; exit 5' TERM\necho up\n"
                                     "while true; do sleep 0.1; done\n")  # fmt: skip
    record = tmp_path / "termination-log"
    program = (
        "import sys; from speculator_operator.pods.supervise import supervise; "
        f"sys.exit(supervise([{vllm!r}], {platform_answer(tmp_path, '')!r}, record_path={str(record)!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"  # vLLM runs, its output copied through
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 5
    assert got.read_text().strip() == "TERM"
    assert not record.exists()


def test_the_record_keeps_the_end_of_a_long_output_within_the_kubelets_limit() -> None:
    tail = "\n".join(f"line {i} ✓ ünïcode" for i in range(2000)) + "\nValueError: the real cause"
    record = classify(1, "cuda", tail)
    text = record.encode()
    assert len(text.encode()) <= REPORT_LIMIT
    decoded = ServerExit.decode(text)
    assert decoded is not None
    assert decoded.reason is ServerExitReason.ENGINE_EXITED
    assert decoded.message.endswith("ValueError: the real cause")


def test_a_record_is_not_a_stage_report_nor_the_reverse() -> None:
    record = classify(1, "", "x").encode()
    report = StageReport(stage="train").encode()
    assert StageReport.decode(record) is None
    assert ServerExit.decode(report) is None
    assert ServerExit.decode("Traceback ... a log tail") is None
    assert ServerExit.decode(json.dumps({"speculatorsServer": 1, "reason": "Whatever", "exitCode": 1})) is None


def crashing_pod(message: str | None) -> dict[str, object]:
    last = {"reason": "Error", "exitCode": 1, **({"message": message} if message is not None else {})}
    return {
        "metadata": {"name": "p-1", "labels": {"speculators.dev/revision": "r1"}},
        "status": {
            "containerStatuses": [
                {
                    "name": "vllm",
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": last},
                }
            ]
        },
    }


def test_the_operator_shows_the_records_reason_and_the_end_of_vllms_words() -> None:
    tail = "\n".join(f"noise {i}" for i in range(300)) + "\nRuntimeError: Failed to infer device type"
    found = pod_problem(crashing_pod(classify(1, "", tail).encode()))
    assert found is not None
    reason, message = found
    assert reason == "NoAccelerator"
    assert len(message) <= MAX_MESSAGE
    assert message.startswith("pod p-1, container vllm: vLLM resolves no accelerator")
    assert "CrashLoopBackOff" in message
    assert message.endswith("RuntimeError: Failed to infer device type")


def test_without_a_record_the_kubelets_reason_stays() -> None:
    assert pod_problem(crashing_pod(None)) is not None
    assert pod_problem(crashing_pod(None))[0] == "CrashLoopBackOff"  # type: ignore[index]
    assert pod_problem(crashing_pod("Traceback: a log tail"))[0] == "CrashLoopBackOff"  # type: ignore[index]


def test_a_first_failure_before_the_crash_loop_already_says_its_reason() -> None:
    pod = {
        "metadata": {"name": "p-1"},
        "status": {"containerStatuses": [{"name": "vllm", "state": {"terminated": {
            "reason": "Error", "exitCode": 1, "message": classify(1, "cpu", "boom").encode()}}}]},
    }  # fmt: skip
    assert pod_problem(pod) == ("EngineExited", "pod p-1, container vllm: vLLM exited with status 1 on its cpu "
                                "platform; its last output:\n…boom")  # fmt: skip


def test_a_rollout_of_a_server_without_an_accelerator_says_so_in_serving() -> None:
    from speculator_operator.api.deployment import SpeculatorDeploymentSpec

    spec = SpeculatorDeploymentSpec.model_validate(
        {"verifier": {"model": "s3://m/v"}, "speculator": {"source": "s3://m/d"}, "serving": {"replicas": 1}}
    )
    child = {
        "metadata": {"generation": 1, "annotations": {"speculators.dev/revision": "r1"}},
        "status": {"observedGeneration": 1, "replicas": 1},
    }
    out = serving_status(spec, "r1", child, [crashing_pod(classify(1, "", "no GPU").encode())])
    assert (out.ready, out.reason) == (False, "NoAccelerator")


def test_the_record_goes_where_the_contract_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REPORT_PATH_ENV, str(tmp_path / "report"))
    from speculator_operator.pods.supervise import write_record

    write_record(classify(2, "", ""))
    decoded = ServerExit.decode((tmp_path / "report").read_text())
    assert decoded is not None
    assert decoded.exit_code == 2
