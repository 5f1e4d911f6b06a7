"""Audit rules on synthetic checkpoints shaped like published ones: the good pass, each mutation fails
with the rule that names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from speculator_operator.adapters.checkpoints import audit
from speculator_operator.domain.checkpoint.rules import RULES
from speculator_operator.domain.releases import Version, get_release

from ..ckptgen import DELETE, QWEN3_8B, Tensors, dflash, eagle3, mutate, write_checkpoint

VLLM = get_release().vllm_version


def run(tmp_path: Path, config: dict[str, Any], tensors: Tensors, *, verifier: dict[str, Any] | None = QWEN3_8B,
        vllm: Version | None = VLLM, **kw: Any) -> dict[str, list[str]]:  # fmt: skip
    write_checkpoint(tmp_path, config, tensors)
    report = audit(str(tmp_path), verifier=verifier, vllm=vllm, **kw)
    out: dict[str, list[str]] = {}
    for f in report.findings:
        out.setdefault(str(f.severity), []).append(f"{f.rule}: {f.message}")
    return out


def errors(result: dict[str, list[str]]) -> list[str]:
    return result.get("error", [])


GOOD = {
    "eagle3-llama": lambda: eagle3(),
    "eagle3-qwen3": lambda: eagle3(decoder="qwen3"),
    "eagle3-full-vocab": lambda: eagle3(draft_vocab=151936),
    "peagle": lambda: eagle3(algorithm="peagle", decoder="qwen3", k=8),
    "dflash": lambda: dflash(),
    "dflash-pruned-vocab": lambda: dflash(draft_vocab=32000),
    "dflash2": lambda: dflash(algorithm="dflash2", block_size=8),
    "dspark": lambda: dflash(algorithm="dspark", block_size=8),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_well_formed_checkpoints_pass(tmp_path: Path, name: str) -> None:
    config, tensors = GOOD[name]()
    result = run(tmp_path, config, tensors)
    assert errors(result) == []
    assert result.get("warning", []) == []


def _shape(tensors: Tensors, name: str, shape: list[int]) -> Tensors:
    out = dict(tensors)
    out[name] = (out[name][0], shape)
    return out


def _drop(tensors: Tensors, *names: str) -> Tensors:
    return {k: v for k, v in tensors.items() if k not in names}


# (description) -> (checkpoint factory, expected rule id, text the message must contain)
BAD: dict[str, tuple[Any, str, str]] = {
    "unknown type": (lambda: (mutate(eagle3()[0], "speculators_model_type", "medusa"), eagle3()[1]),
                     "model-type", "'medusa'"),
    "no type": (lambda: (mutate(eagle3()[0], "speculators_model_type", DELETE), eagle3()[1]),
                "model-type", "not a speculators checkpoint"),
    "no verifier name": (lambda: (mutate(eagle3()[0], "speculators_config.verifier", {}), eagle3()[1]),
                         "config-structure", "name_or_path"),
    "layer config not object": (lambda: (mutate(eagle3()[0], "transformer_layer_config", "llama"), eagle3()[1]),
                                "config-structure", "transformer_layer_config"),
    "default method unknown": (
        lambda: (mutate(eagle3()[0], "speculators_config.default_proposal_method", "beam"), eagle3()[1]),
        "proposal", "'beam'"),
    "K zero": (lambda: (mutate(eagle3()[0], "speculators_config.proposal_methods.0.speculative_tokens", 0),
                        eagle3()[1]), "proposal", "got 0"),
    "lossy accept_k": (lambda: (mutate(eagle3()[0], "speculators_config.proposal_methods.0.verifier_accept_k", 2),
                                eagle3()[1]), "lossless", "verifier_accept_k=2"),
    "lossy tolerance": (lambda: (mutate(eagle3()[0], "speculators_config.proposal_methods.0.accept_tolerance", 0.5),
                                 eagle3()[1]), "lossless", "accept_tolerance=0.5"),
    "eagle3 mistral decoder": (lambda: (mutate(eagle3()[0], "transformer_layer_config.model_type", "mistral"),
                                        eagle3()[1]), "decoder-family", "'mistral'"),
    "norm_before_fc and fc_norm": (lambda: (mutate(eagle3()[0], "fc_norm", True), eagle3()[1]),
                                   "decoder-family", "fc_norm"),
    "fc too narrow": (lambda: (eagle3()[0], _shape(eagle3()[1], "fc.weight", [4096, 8192])),
                      "fc-shape", "expected [4096, 12288]"),
    "fc with default aux count": (
        lambda: (mutate(eagle3()[0], "eagle_aux_hidden_state_layer_ids", None),
                 _shape(eagle3()[1], "fc.weight", [4096, 16384])), "fc-shape", "the default 3 aux layers"),
    "dflash fc vs 4 aux ids": (lambda: (mutate(dflash()[0], "aux_hidden_state_layer_ids", [1, 9, 18, 33]),
                                        dflash()[1]), "fc-shape", "4 aux ids"),
    "dflash without aux ids": (lambda: (mutate(dflash()[0], "aux_hidden_state_layer_ids", DELETE), dflash()[1]),
                               "aux-layer-ids", "no default"),
    "duplicate aux ids": (lambda: (mutate(eagle3()[0], "eagle_aux_hidden_state_layer_ids", [2, 2, 33]),
                                   eagle3()[1]), "aux-layer-ids", "duplicates"),
    "lm_head wrong rows": (lambda: (eagle3()[0], _shape(eagle3()[1], "lm_head.weight", [151936, 4096])),
                           "lm-head", "expected [32000, 4096]"),
    "lm_head missing": (lambda: (eagle3()[0], _drop(eagle3()[1], "lm_head.weight")), "lm-head", "missing"),
    "dflash pruned vocab without lm_head": (
        lambda: (dflash(draft_vocab=32000)[0], _drop(dflash(draft_vocab=32000)[1], "lm_head.weight")),
        "lm-head", "missing"),
    "embed_tokens wrong vocab": (lambda: (eagle3()[0], _shape(eagle3()[1], "embed_tokens.weight", [152064, 4096])),
                                 "embed-tokens", "expected [151936, 4096]"),
    "t2d missing": (lambda: (eagle3()[0], _drop(eagle3()[1], "t2d")), "vocab-maps", "t2d is missing"),
    "t2d wrong dtype": (lambda: (eagle3()[0], {**eagle3()[1], "t2d": ("I64", [151936])}), "vocab-maps",
                        "expected BOOL [151936]"),
    "vocab maps on full vocab": (lambda: (eagle3(draft_vocab=151936)[0],
                                          {**eagle3(draft_vocab=151936)[1], "t2d": ("BOOL", [151936])}),
                                 "vocab-maps", "t2d is present"),
    "eagle3 q_proj takes H": (lambda: (eagle3()[0], _shape(eagle3()[1], "layers.0.self_attn.q_proj.weight",
                                                            [4096, 4096])), "layer0-attention", "must be 8192"),
    "dflash k_proj takes 2H": (lambda: (dflash()[0], _shape(dflash()[1], "layers.0.self_attn.k_proj.weight",
                                                             [1024, 8192])), "layer0-attention", "must be 4096"),
    "layer count": (lambda: (mutate(dflash()[0], "transformer_layer_config.num_hidden_layers", 6), dflash()[1]),
                    "layer-count", "num_hidden_layers is 6"),
    "published dflash K=block": (
        lambda: (mutate(mutate(dflash(block_size=8)[0], "speculators_config.proposal_methods.0.speculative_tokens", 8),
                        "sample_from_anchor", DELETE), dflash(block_size=8)[1]),
        "speculative-tokens", "so it must be 7"),
    "dspark K=block-1": (
        lambda: (mutate(dflash(algorithm="dspark", block_size=8)[0],
                        "speculators_config.proposal_methods.0.speculative_tokens", 7),
                 dflash(algorithm="dspark", block_size=8)[1]), "speculative-tokens", "must be 8"),
    "peagle K vs num_depths": (lambda: (mutate(eagle3(algorithm="peagle", k=8)[0], "num_depths", 6),
                                        eagle3(algorithm="peagle", k=8)[1]), "speculative-tokens", "num_depths is 6"),
    "dflash no mask token": (lambda: (mutate(dflash()[0], "mask_token_id", None), dflash()[1]),
                             "mask-token", "requires it"),
    "dflash2 pruned vocab": (lambda: dflash(algorithm="dflash2", block_size=8, draft_vocab=32000),
                             "algorithm-specific", "full vocabulary"),
    "verifier hidden": (lambda: eagle3({**QWEN3_8B, "hidden_size": 5120}), "verifier-hidden-size",
                        "!= verifier hidden_size 4096"),
    "verifier vocab": (lambda: eagle3({**QWEN3_8B, "vocab_size": 152064}), "verifier-vocab",
                       "vocabulary of 152064 but the verifier has 151936"),
    "aux id beyond verifier": (lambda: (mutate(eagle3()[0], "eagle_aux_hidden_state_layer_ids", [2, 18, 40]),
                                        eagle3()[1]), "verifier-layers", "[40] beyond the verifier's 36"),
    "trained on llama": (lambda: (mutate(eagle3()[0], "speculators_config.verifier.architectures",
                                         ["LlamaForCausalLM"]), eagle3()[1]), "verifier-architecture",
                         "LlamaForCausalLM"),
    "mtp": (lambda: (mutate(dflash()[0], "speculators_model_type", "mtp"), dflash()[1]), "vllm-loadable",
            "stitch-mtp"),
    "no norm_before_residual": (lambda: (mutate(eagle3()[0], "norm_before_residual", DELETE), eagle3()[1]),
                                "vllm-defaults", "vLLM serves it as true"),
    "no sliding_window_non_causal": (lambda: (mutate(dflash()[0], "sliding_window_non_causal", DELETE),
                                              dflash()[1]), "vllm-defaults", "non-causal"),
    "causal flag with a full-attention layer": (
        lambda: (mutate(dflash()[0], "transformer_layer_config.layer_types",
                        ["sliding_attention"] * 4 + ["full_attention"]), dflash()[1]),
        "vllm-servable", "trained full-attention layer(s) [4] non-causal"),
    "dflash sample_from_anchor": (lambda: dflash(sample_from_anchor=True), "vllm-servable", "rejects it"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_defect_is_caught_by_its_rule(tmp_path: Path, case: str) -> None:
    factory, rule_id, text = BAD[case]
    config, tensors = factory()
    result = run(tmp_path, config, tensors)
    hits = [e for e in errors(result) if e.startswith(rule_id + ":")]
    assert hits, f"expected an error from {rule_id}, got {result}"
    assert any(text in h for h in hits), hits


def test_lossy_is_a_warning_when_allowed(tmp_path: Path) -> None:
    config = mutate(eagle3()[0], "speculators_config.proposal_methods.0.verifier_accept_k", 2)
    result = run(tmp_path, config, eagle3()[1], allow_lossy=True)
    assert errors(result) == []
    assert any(w.startswith("lossless:") and "allowed" in w for w in result["warning"])


def test_missing_aux_ids_warn_with_the_layers_vllm_will_use(tmp_path: Path) -> None:
    config = mutate(eagle3()[0], "eagle_aux_hidden_state_layer_ids", None)
    result = run(tmp_path, config, eagle3()[1])
    assert errors(result) == []
    assert any("(2, 18, 33)" in w for w in result["warning"])


@pytest.mark.parametrize(
    ("factory", "vllm", "text"),
    [
        (lambda: dflash(), "0.20.0", "dflash needs vLLM >= 0.22.0"),
        (lambda: dflash(algorithm="dspark", block_size=8), "0.24.0", "dspark needs vLLM >= 0.25.0"),
        (lambda: eagle3(decoder="qwen3"), "0.23.0", "qwen3 decoder layer needs vLLM >= 0.24.0"),
        (lambda: eagle3(), "0.18.0", "norm_before_fc: true needs vLLM >= 0.19.0"),
    ],
)
def test_older_vllm_is_refused_for_what_it_cannot_serve(tmp_path: Path, factory: Any, vllm: str, text: str) -> None:
    config, tensors = factory()
    result = run(tmp_path, config, tensors, vllm=Version.parse(vllm))
    assert any(text in e for e in errors(result)), result


def test_without_verifier_the_audit_says_what_it_skipped(tmp_path: Path) -> None:
    config, tensors = eagle3({**QWEN3_8B, "hidden_size": 5120})  # would fail against the real verifier
    result = run(tmp_path, config, tensors, verifier=None)
    assert errors(result) == []
    assert any(i.startswith("verifier-compatibility:") for i in result["info"])


def test_garbage_config_values_become_findings_not_crashes(tmp_path: Path) -> None:
    config = eagle3()[0]
    config["transformer_layer_config"]["hidden_size"] = "4096"
    config["speculators_config"]["proposal_methods"] = "greedy"
    config["eagle_aux_hidden_state_layer_ids"] = {"a": 1}
    result = run(tmp_path, config, eagle3()[1])
    rules = {e.split(":")[0] for e in errors(result)}
    assert {"config-structure", "aux-layer-ids"} <= rules


def test_rule_ids_are_unique_and_described() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    assert all(r.summary for r in RULES)


def test_rules_run_in_the_order_their_findings_are_listed() -> None:
    """rules/__init__.py imports the families in this order (each registers its rules as it is imported): a
    report's findings follow it, so a reordered import must not pass unnoticed."""
    assert [r.id for r in RULES] == [
        "model-type", "config-structure", "proposal", "lossless", "decoder-family", "hidden-size", "aux-layer-ids",
        "fc-shape", "lm-head", "embed-tokens", "embed-tokens-shared", "vocab-maps", "layer0-attention", "layer-count",
        "speculative-tokens", "declared-draft", "mask-token", "algorithm-specific", "dtype",
        "verifier-hidden-size", "verifier-vocab", "verifier-layers", "verifier-architecture", "verifier-name",
        "verifier-revision", "provenance",
        "vllm-loadable", "vllm-features", "vllm-defaults", "vllm-servable", "vllm-runner",
        "deep-loaded", "deep-vocab-map",
    ]  # fmt: skip


def test_dflash2_as_speculators_writes_it_is_served_faithfully_on_the_v2_runner(tmp_path: Path) -> None:
    """sliding_window_non_causal true with every layer a sliding window: speculators trains each layer
    non-causal and vLLM 0.32.0 serves each one non-causal (dflash_config.causal = false); its candidate head
    needs the V2 model runner."""
    config, tensors = dflash(algorithm="dflash2", block_size=8)
    assert config["sliding_window_non_causal"] is True
    result = run(tmp_path, config, tensors)
    assert errors(result) == []
    assert any(f.startswith("vllm-runner") and "candidate head" in f for f in result["info"])
    # non-causal with a full-attention layer as well: both sides run every layer non-causal
    mixed = mutate(config, "transformer_layer_config.layer_types", ["sliding_attention"] * 4 + ["full_attention"])
    result = run(tmp_path, mixed, tensors)
    assert errors(result) == []
    assert any("mixed sliding-window and full-attention" in f for f in result["info"])


def test_a_declared_algorithm_the_checkpoint_contradicts_is_an_error_and_a_declared_k_a_warning(
    tmp_path: Path,
) -> None:
    config, tensors = eagle3()  # speculative_tokens 3
    assert errors(run(tmp_path / "a", config, tensors, declared=("eagle3", 3))) == []
    result = run(tmp_path / "b", config, tensors, declared=("dflash", 5))
    assert errors(result) == ["declared-draft: speculator.algorithm is dflash but the checkpoint is eagle3"]
    assert "declared-draft: speculator.speculativeTokens is 5 but the checkpoint's is 3: auto serves the " \
        "checkpoint's" in result["warning"]  # fmt: skip
    assert not any(f.startswith("declared-draft") for f in run(tmp_path / "c", config, tensors).get("warning", []))
