"""The evaluate stage's client and its held-out split, below real vLLM: prompts, the judgement, and the client
against a stand-in server that answers like vLLM (its /health, /metrics counters and /v1/completions).
Real vLLM (CPU build) runs the same client in tests/workloads/test_evaluate.py."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from speculator_harness.cluster import free_port
from speculator_operator.pods import evaluate as evaluation
from speculator_operator.pods.holdout import EvaluationError, check_count, prompt_of

from ..ckptgen import SMALL_QWEN3, eagle3, write_checkpoint
from .vllm_like import VllmLike

K = 3


class StandIn(VllmLike):
    """A vLLM-like server: each completion adds `drafts_per_request` drafts of K tokens, `accepted` of them
    accepted per draft; `speculating=False` exports no spec-decode counters (a server without a draft)."""

    def __init__(self, accepted: float = 2.0, speculating: bool = True) -> None:
        self.accepted, self.speculating = accepted, speculating
        self.drafts = 0
        self.bodies: list[dict[str, Any]] = []
        super().__init__()

    def complete(self, body: dict[str, Any]) -> int:
        self.bodies.append(body)
        self.drafts += 4
        return int(body["max_tokens"])

    def metrics(self) -> str:
        lines = ['vllm:generation_tokens_total{model_name="m"} 0']
        if self.speculating:
            d = self.drafts
            lines += [
                f'vllm:spec_decode_num_drafts_total{{model_name="m"}} {d}',
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="m"}} {d * K}',
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="m"}} {d * self.accepted}',
            ]
        return "\n".join(lines) + "\n"


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    checkpoints, verifier = tmp_path / "checkpoints", tmp_path / "verifier"
    write_checkpoint(checkpoints / "0", *eagle3(SMALL_QWEN3, draft_vocab=1024, k=K))
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps(SMALL_QWEN3))
    return checkpoints, verifier


@pytest.fixture
def report_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "report.json"
    monkeypatch.setenv("SPECULATOR_REPORT_PATH", str(path))
    return path


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    server = StandIn()
    yield server
    server.stop()


def args_for(endpoint: str, pair: tuple[Path, Path], **over: Any) -> argparse.Namespace:
    values: dict[str, Any] = {
        "endpoint": endpoint, "model": "/workspace/verifier", "checkpoint": str(pair[0]), "verifier": str(pair[1]),
        "prompts_file": None, "prompts_json": json.dumps(["a", "b", "c"]), "max_tokens": 8, "temperature": 0.0,
        "seed": 0, "concurrency": 2, "timeout": 30.0, "k": None, "min_acceptance": None, "min_speedup": None,
    }  # fmt: skip
    return argparse.Namespace(**{**values, **over})


def test_the_prompt_is_what_comes_before_the_first_counted_token() -> None:
    assert prompt_of([5, 6, 7, 8, 9], [0, 0, 0, 1, 1]) == [5, 6, 7]
    assert prompt_of([5, 6, 7], [0, 0, 0]) == [5, 6, 7]  # nothing counted: the whole sample
    assert prompt_of([5, 6, 7], [1, 1, 1]) == [5]  # a prompt is never empty


def test_the_held_out_samples_must_leave_some_to_train_on() -> None:
    check_count(17, 16)
    with pytest.raises(EvaluationError, match="heldOut 16 must leave some to train on"):
        check_count(16, 16)


def test_prompts_come_from_the_spec_or_the_held_out_file(tmp_path: Path) -> None:
    assert evaluation.load_prompts(None, json.dumps(["hello", "world"])) == ["hello", "world"]
    held = tmp_path / "prompts.jsonl"
    held.write_text(json.dumps({"prompt_token_ids": [1, 2]}) + "\n\n" + json.dumps({"prompt": "hi"}) + "\n")
    assert evaluation.load_prompts(str(held), None) == [[1, 2], "hi"]
    held.write_text(json.dumps({"prompt_token_ids": []}) + "\n")
    with pytest.raises(EvaluationError, match=r"prompts\.jsonl:1: neither prompt_token_ids nor prompt"):
        evaluation.load_prompts(str(held), None)
    held.write_text("")
    with pytest.raises(EvaluationError, match="no prompts to evaluate"):
        evaluation.load_prompts(str(held), None)
    with pytest.raises(EvaluationError, match="list of non-empty strings"):
        evaluation.load_prompts(None, json.dumps([""]))


@pytest.mark.parametrize(
    ("measured", "bounds", "outcome", "code"),
    [
        ({"drafts": 0}, (0.5, None), "ZeroDrafts", 4),
        ({"drafts": 10, "rate": 0.4}, (0.5, None), "AcceptanceBelowThreshold", 3),
        ({"drafts": 10, "rate": 0.5}, (0.5, None), "Passed", 0),
        ({"drafts": 10, "rate": 0.9, "predictedSpeedup": 1.1}, (0.5, 1.2), "AcceptanceBelowThreshold", 3),
        ({"drafts": 10, "rate": 0.9}, (None, 1.2), "AcceptanceBelowThreshold", 3),  # no cost ratio: unknown
        ({"drafts": 10, "rate": 0.1}, (None, None), "Passed", 0),  # no bound: measured only
    ],
)
def test_the_judgement(measured: dict[str, Any], bounds: tuple[Any, Any], outcome: str, code: int) -> None:
    got, message, exit_code = evaluation.judge(measured, *bounds)
    assert (got, exit_code) == (outcome, code), message


def test_a_draft_above_its_bound_passes_with_its_numbers_reported(
    stand_in: StandIn, pair: tuple[Path, Path], report_path: Path
) -> None:
    assert evaluation.main(args_for(stand_in.url, pair, min_acceptance=0.5)) == 0
    reported = json.loads(report_path.read_text())
    ev = reported["evaluation"]
    assert ev["outcome"] == "Passed"
    assert (ev["prompts"], ev["tokens"], ev["k"], ev["drafts"]) == (3, 24, K, 12)
    assert ev["rate"] == pytest.approx(2 / 3, abs=1e-4)
    assert ev["meanAcceptedLength"] == pytest.approx(3.0)
    assert ev["predictedSpeedup"] > 1
    assert ev["costRatio"] > 0
    # fixed sampling: greedy, seeded, EOS ignored so that every request generates max_tokens
    assert {(b["temperature"], b["seed"], b["ignore_eos"], b["max_tokens"]) for b in stand_in.bodies} == {
        (0.0, 0, True, 8)
    }
    assert sorted(b["prompt"] for b in stand_in.bodies) == ["a", "b", "c"]


def test_a_draft_below_its_bound_is_refused_with_its_numbers(
    stand_in: StandIn, pair: tuple[Path, Path], report_path: Path
) -> None:
    stand_in.accepted = 0.3
    assert evaluation.main(args_for(stand_in.url, pair, min_acceptance=0.5)) == 3
    ev = json.loads(report_path.read_text())["evaluation"]
    assert ev["outcome"] == "AcceptanceBelowThreshold"
    assert ev["rate"] == pytest.approx(0.1)
    assert ev["minAcceptance"] == 0.5


def test_a_server_without_speculation_is_zero_drafts(pair: tuple[Path, Path], report_path: Path) -> None:
    server = StandIn(speculating=False)
    try:
        assert evaluation.main(args_for(server.url, pair, min_acceptance=0.5)) == 4
    finally:
        server.stop()
    ev = json.loads(report_path.read_text())["evaluation"]
    assert ev["outcome"] == "ZeroDrafts"
    assert ev["tokens"] == 24  # the requests were answered; nothing was drafted


def test_a_server_never_ready_ends_within_the_timeout(pair: tuple[Path, Path], report_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    assert evaluation.main(args_for(closed, pair, timeout=1.0, min_acceptance=0.5)) == 5
    reported = json.loads(report_path.read_text())
    assert reported["evaluation"] == {"outcome": "EvaluationServerNotReady", "minAcceptance": 0.5}
    assert "was not ready within 1 s" in reported["message"]


def test_bad_input_is_exit_2_before_any_request(stand_in: StandIn, pair: tuple[Path, Path], tmp_path: Path) -> None:
    assert evaluation.main(args_for(stand_in.url, pair, prompts_json=None, prompts_file=str(tmp_path / "no"))) == 2
    assert evaluation.main(args_for(stand_in.url, pair, checkpoint=str(tmp_path / "empty"))) == 2
    assert stand_in.bodies == []
