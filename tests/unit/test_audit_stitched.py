"""The audit of a stitched MTP model (a verifier with fine-tuned `mtp.*` weights, served with method mtp):
a well-formed one passes, each fault fails with the rule that names it; and an EAGLE draft without its own
embed_tokens (SafeAILab's layout, kept by speculators' converter) passes with a note, since vLLM 0.32.0 shares
the verifier's embedding with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.domain.releases import get_release

from ..ckptgen import QWEN3_8B, QWEN3_NEXT, Tensors, eagle3, mutate, stitched_mtp, write_checkpoint

RELEASE = get_release()


def findings(tmp_path: Path, config: dict[str, Any], tensors: Tensors, **kw: Any) -> dict[str, list[str]]:
    write_checkpoint(tmp_path, config, tensors)
    report = audit(str(tmp_path), release=RELEASE, **{"verifier": QWEN3_NEXT, **kw})
    out: dict[str, list[str]] = {}
    for f in report.findings:
        out.setdefault(str(f.severity), []).append(f"{f.rule}: {f.message}")
    return out


def test_a_stitched_model_passes_and_says_how_it_is_served(tmp_path: Path) -> None:
    result = findings(tmp_path, *stitched_mtp(), speculative_tokens=1)
    assert result.get("error", []) == []
    assert result.get("warning", []) == []
    assert any(f.startswith("mtp-stitched-served") and '"method": "mtp"' in f for f in result["info"])


def test_a_qwen3_5_model_counts_its_layers_from_mtp_num_hidden_layers(tmp_path: Path) -> None:
    config = {**QWEN3_NEXT, "model_type": "qwen3_5_text", "mtp_num_hidden_layers": 2}
    del config["num_nextn_predict_layers"]
    result = findings(tmp_path, *stitched_mtp(config, layers=2), verifier=config, speculative_tokens=4)
    assert result.get("error", []) == []


def _without(tensors: Tensors, name: str) -> Tensors:
    return {k: v for k, v in tensors.items() if k != name}


BAD: dict[str, tuple[Any, dict[str, Any], str, str]] = {
    "a family vLLM does not serve with mtp": (
        lambda: stitched_mtp({**QWEN3_NEXT, "model_type": "llama"}), {}, "mtp-stitched-family", "'llama'"),
    "no MTP layer count": (
        lambda: stitched_mtp({**QWEN3_NEXT, "num_nextn_predict_layers": 0}), {}, "mtp-stitched-layers",
        "num_nextn_predict_layers is 0"),
    "fewer layers than the count": (
        lambda: stitched_mtp({**QWEN3_NEXT, "num_nextn_predict_layers": 2}), {}, "mtp-stitched-layers",
        "no mtp.layers.1"),
    "a tensor vLLM has no parameter for": (
        lambda: (stitched_mtp()[0], {**stitched_mtp()[1], "verifier_lm_head.weight": ("BF16", [151936, 2048])}),
        {}, "mtp-stitched-names", "'verifier_lm_head.weight'"),
    "more layers than the count": (lambda: stitched_mtp(layers=2), {}, "mtp-stitched-layers", "mtp.layers.1"),
    "fc missing": (lambda: (stitched_mtp()[0], _without(stitched_mtp()[1], "mtp.fc.weight")), {},
                   "mtp-stitched-shapes", "mtp.fc.weight is missing"),
    "fc the wrong width": (
        lambda: (stitched_mtp()[0], {**stitched_mtp()[1], "mtp.fc.weight": ("BF16", [2048, 2048])}), {},
        "mtp-stitched-shapes", "expected [2048, 4096]"),
    "a norm missing": (lambda: (stitched_mtp()[0], _without(stitched_mtp()[1], "mtp.pre_fc_norm_hidden.weight")),
                       {}, "mtp-stitched-shapes", "mtp.pre_fc_norm_hidden.weight is missing"),
    "stitched into another verifier": (
        lambda: stitched_mtp(), {"verifier": {**QWEN3_NEXT, "num_hidden_layers": 64}}, "mtp-stitched-verifier",
        "num_hidden_layers is 48, the verifier's is 64"),
    "K not a multiple of n_predict": (
        lambda: stitched_mtp({**QWEN3_NEXT, "num_nextn_predict_layers": 2}, layers=2),
        {"verifier": {**QWEN3_NEXT, "num_nextn_predict_layers": 2}, "speculative_tokens": 3},
        "mtp-stitched-tokens", "num_speculative_tokens 3 is above n_predict 2"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_faulty_stitched_model_fails_with_the_rule_that_names_it(tmp_path: Path, case: str) -> None:
    make, kw, rule, text = BAD[case]
    config, tensors = make()
    errors = findings(tmp_path, config, tensors, **kw).get("error", [])
    assert any(e.startswith(rule) and text in e for e in errors), errors


def test_an_eagle_draft_without_embed_tokens_is_served_on_the_verifiers(tmp_path: Path) -> None:
    config, tensors = eagle3()
    del tensors["embed_tokens.weight"]
    result = findings(tmp_path, config, tensors, verifier=QWEN3_8B)
    assert result.get("error", []) == []
    assert any(f.startswith("embed-tokens-shared") for f in result["info"])
    wrong = {**eagle3()[1], "embed_tokens.weight": ("BF16", [1000, 4096])}
    assert any(e.startswith("embed-tokens:") for e in findings(tmp_path, config, wrong, verifier=QWEN3_8B)["error"])


def test_a_speculators_checkpoint_still_gets_the_speculators_rules(tmp_path: Path) -> None:
    config = mutate(eagle3()[0], "speculators_model_type", "medusa")
    assert any(e.startswith("model-type") for e in findings(tmp_path, config, eagle3()[1])["error"])


def test_a_stitched_model_is_what_a_deployment_declaring_mtp_expects(tmp_path: Path) -> None:
    assert findings(tmp_path / "a", *stitched_mtp(), speculative_tokens=1, declared=("mtp", 1)).get("error", []) == []
    result = findings(tmp_path / "b", *stitched_mtp(), speculative_tokens=1, declared=("eagle3", None))
    assert result["error"] == ["declared-draft: speculator.algorithm is eagle3 but the checkpoint is mtp"]
