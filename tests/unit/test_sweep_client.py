"""The sweep's client (pods/sweep.py) below real vLLM: against a stand-in that answers like vLLM (its /health, its
counters and /v1/completions), the points it reports, and every way a point is refused with the K and concurrency it
reached. Real vLLM runs the same client in tests/workloads/test_evaluate.py."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from speculator_harness.cluster import free_port
from speculator_operator.api.podcontract import StageReport
from speculator_operator.pods import sweep
from speculator_operator.pods.device import write_device_file

from ..ckptgen import eagle3, write_checkpoint
from .vllm_like import VllmLike

STEP_S = 0.01  # each request-step, as the stand-in reports it


class StandIn(VllmLike):
    """Each completion counts its tokens as generated, one ITL observation per token and one engine step per token
    (a batch of one); `short` answers fewer tokens than asked, `miscount` makes the server count fewer."""

    def __init__(self) -> None:
        self.generated = self.itl_count = self.steps = 0.0
        self.short = self.miscount = False
        self.lock = threading.Lock()
        super().__init__()

    def complete(self, body: dict[str, Any]) -> int:
        tokens = int(body["max_tokens"]) - (1 if self.short else 0)
        with self.lock:
            self.generated += tokens - (1 if self.miscount else 0)
            self.itl_count += tokens
            self.steps += tokens
        return tokens

    def metrics(self) -> str:
        return "\n".join(
            [
                f'vllm:generation_tokens_total{{model_name="m"}} {self.generated}',
                "# TYPE vllm:inter_token_latency_seconds histogram",
                f'vllm:inter_token_latency_seconds_count{{model_name="m"}} {self.itl_count}',
                f'vllm:inter_token_latency_seconds_sum{{model_name="m"}} {self.itl_count * STEP_S}',
                "# TYPE vllm:iteration_tokens_total histogram",
                f'vllm:iteration_tokens_total_count{{model_name="m"}} {self.steps}',
                f'vllm:iteration_tokens_total_sum{{model_name="m"}} {self.steps}',
            ]
        )


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    s = StandIn()
    yield s
    s.stop()


@pytest.fixture
def report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "report"
    monkeypatch.setenv("SPECULATOR_REPORT_PATH", str(path))
    return path


def args(endpoint: str, tmp_path: Path, label: str = "plain", served: int = 0, **over: Any) -> argparse.Namespace:
    write_checkpoint(tmp_path / "ck", *eagle3())  # K = 3
    device = tmp_path / "device.json"
    write_device_file(str(device), served)
    base = {"endpoint": endpoint, "model": "m", "checkpoint": str(tmp_path / "ck"), "label": label, "k": None,
            "device_file": str(device), "prompts_file": None, "prompts_json": json.dumps(["a", "b", "c", "d"]),
            "concurrencies": "1,2,4", "rounds": 2, "max_tokens": 8, "seed": 0, "timeout": 60.0}  # fmt: skip
    return argparse.Namespace(**{**base, **over})


def test_every_point_is_measured_from_the_servers_own_counters(stand_in: StandIn, tmp_path: Path, report: Path) -> None:
    assert sweep.main(args(stand_in.url, tmp_path)) == 0
    got = StageReport.model_validate_json(report.read_text()).sweep
    assert got is not None
    assert (got["label"], got["k"], got["device"]) == ("plain", 0, "cpu")
    assert [(p["k"], p["c"], p["n"], p["tokens"]) for p in got["points"]] == [(0, 1, 2, 16), (0, 2, 4, 32),
                                                                               (0, 4, 8, 64)]  # fmt: skip
    assert all(p["itlMs"] == pytest.approx(STEP_S * 1000) for p in got["points"])
    assert all(p["running"] == 1.0 for p in got["points"])


def test_the_half_k_stage_measures_half_the_checkpoints_k(stand_in: StandIn, tmp_path: Path, report: Path) -> None:
    assert sweep.served_k("half", str(tmp_path), 3) == 2
    assert sweep.served_k("k", str(tmp_path), 5) == 5
    # a server serving another K than the stage measures is refused before any request
    code = sweep.main(args(stand_in.url, tmp_path, label="half", served=3))
    assert code == 6
    left = StageReport.model_validate_json(report.read_text())
    assert left.sweep is not None
    assert left.sweep["failedAt"] == {"k": 2, "concurrency": 1}
    assert "serves K=3" in (left.message or "")
    assert stand_in.generated == 0


@pytest.mark.parametrize(
    ("fault", "words"),
    [("short", "the completions counted"), ("miscount", "vLLM counted")],
)
def test_an_inconsistent_point_fails_the_stage_naming_it(
    stand_in: StandIn, tmp_path: Path, report: Path, fault: str, words: str
) -> None:
    setattr(stand_in, fault, True)
    assert sweep.main(args(stand_in.url, tmp_path)) == 6
    left = StageReport.model_validate_json(report.read_text())
    assert left.sweep is not None
    assert left.sweep["failedAt"] == {"k": 0, "concurrency": 1}
    assert left.sweep["points"] == []  # nothing measured is reported as whole
    assert words in (left.message or "")


def test_bad_input_is_exit_2_before_any_request(stand_in: StandIn, tmp_path: Path) -> None:
    assert sweep.main(args(stand_in.url, tmp_path, concurrencies="1,x")) == 2
    assert sweep.main(args(stand_in.url, tmp_path, prompts_json="[]")) == 2
    assert stand_in.generated == 0


def test_a_server_never_ready_fails_at_the_first_point(tmp_path: Path, report: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert sweep.main(args(dead, tmp_path, timeout=1.0)) == 6
    left = StageReport.model_validate_json(report.read_text())
    assert left.sweep is not None
    assert left.sweep["failedAt"] == {"k": 0, "concurrency": 1}
