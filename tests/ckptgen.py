"""Synthetic speculators checkpoints shaped like real published ones, for tests and benchmarks.

Tensors are written as a real safetensors layout (8-byte length, JSON header, data section). With
`sparse=True` the data section is a hole (the file is truncated to its full size), so a 17 GB
checkpoint costs no disk and reading it proves the reader touched only the header.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "BOOL": 1}

Tensors = dict[str, tuple[str, list[int]]]

QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
}


# A small Qwen3 verifier's config (hidden 256, 8 layers, vocab 4096): drafts for it are a few MB.
SMALL_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
    "vocab_size": 4096,
}  # fmt: skip


def write_safetensors(path: Path, tensors: Tensors, sparse: bool = True, fill: bytes = b"\x01") -> int:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        if sparse:
            fh.truncate(8 + len(raw) + offset)
        else:
            fh.write(fill * offset if len(fill) == 1 else (fill * (offset // len(fill) + 1))[:offset])
    return 8 + len(raw) + offset


def write_checkpoint(
    folder: Path, config: dict[str, Any], tensors: Tensors, shards: int = 1, sparse: bool = True, fill: bytes = b"\x01"
) -> Path:
    """A checkpoint folder; `fill` is the byte pattern of the weights when they are written (not sparse)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if shards == 1:
        write_safetensors(folder / "model.safetensors", tensors, sparse, fill)
        return folder
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        part = {n: tensors[n] for n in names[i * per : (i + 1) * per]}
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(folder / fname, part, sparse, fill)
        weight_map.update(dict.fromkeys(part, fname))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def _decoder_layer(
    i: int, h: int, heads: int, kv: int, hd: int, inter: int, q_in: int, qk_norm: bool, dtype: str = "BF16"
) -> Tensors:
    p = f"layers.{i}."
    t: Tensors = {
        p + "self_attn.q_proj.weight": (dtype, [heads * hd, q_in]),
        p + "self_attn.k_proj.weight": (dtype, [kv * hd, q_in]),
        p + "self_attn.v_proj.weight": (dtype, [kv * hd, q_in]),
        p + "self_attn.o_proj.weight": (dtype, [h, heads * hd]),
        p + "input_layernorm.weight": (dtype, [h]),
        p + "post_attention_layernorm.weight": (dtype, [h]),
        p + "mlp.gate_proj.weight": (dtype, [inter, h]),
        p + "mlp.up_proj.weight": (dtype, [inter, h]),
        p + "mlp.down_proj.weight": (dtype, [h, inter]),
    }
    if qk_norm:
        t[p + "self_attn.q_norm.weight"] = (dtype, [hd])
        t[p + "self_attn.k_norm.weight"] = (dtype, [hd])
    return t


def _layer_config(
    model_type: str, h: int, layers: int, heads: int, kv: int, hd: int, inter: int, vocab: int
) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "hidden_size": h,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "intermediate_size": inter,
        "vocab_size": vocab,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
    }


def _speculators_config(algorithm: str, k: int, verifier: str, architectures: list[str]) -> dict[str, Any]:
    return {
        "algorithm": algorithm,
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": k, "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
        "verifier": {"name_or_path": verifier, "architectures": architectures},
    }


def eagle3(
    verifier: dict[str, Any] = QWEN3_8B,
    *,
    draft_vocab: int = 32000,
    aux: list[int] | None = None,
    decoder: str = "llama",
    layers: int = 1,
    k: int = 3,
    algorithm: str = "eagle3",
    verifier_name: str = "Qwen/Qwen3-8B",
) -> tuple[dict[str, Any], Tensors]:
    """An EAGLE-3 (or P-EAGLE) draft as speculators 0.9.0 writes it (Qwen3-8B: fc [4096, 12288] ...)."""
    h, v, lv = verifier["hidden_size"], verifier["vocab_size"], verifier["num_hidden_layers"]
    heads, kv, hd = verifier["num_attention_heads"], verifier["num_key_value_heads"], verifier["head_dim"]
    aux = [2, lv // 2, lv - 3] if aux is None else aux
    config: dict[str, Any] = {
        "architectures": ["PEagleDraftModel" if algorithm == "peagle" else "Eagle3DraftModel"],
        "speculators_model_type": algorithm,
        "speculators_version": "0.9.0",
        "speculators_config": _speculators_config(algorithm, k, verifier_name, verifier["architectures"]),
        "transformer_layer_config": _layer_config(decoder, h, layers, heads, kv, hd, verifier["intermediate_size"], v),
        "draft_vocab_size": draft_vocab,
        "eagle_aux_hidden_state_layer_ids": aux,
        "norm_before_residual": True,
        "norm_before_fc": True,
        "fc_norm": False,
        "norm_output": True,
        "embed_requires_grad": algorithm == "peagle",
        "target_hidden_size": None,
        "dtype": "bfloat16",
        "tie_word_embeddings": False,
    }
    a = len(aux) or 3
    tensors: Tensors = {
        "embed_tokens.weight": ("BF16", [v, h]),
        "fc.weight": ("BF16", [h, a * h]),
        "input_norm.weight": ("BF16", [a * h]),
        "norm.weight": ("BF16", [h]),
        "lm_head.weight": ("BF16", [draft_vocab, h]),
        "layers.0.hidden_norm.weight": ("BF16", [h]),
    }
    for i in range(layers):
        q_in = 2 * h if i == 0 else h
        tensors.update(_decoder_layer(i, h, heads, kv, hd, verifier["intermediate_size"], q_in, decoder == "qwen3"))
    if draft_vocab != v:
        tensors["d2t"] = ("I64", [draft_vocab])
        tensors["t2d"] = ("BOOL", [v])
    if algorithm == "peagle":
        config["mask_token_id"] = v - 1
        tensors["mask_hidden"] = ("BF16", [1, 1, a * h])
    return config, tensors


def dflash(
    verifier: dict[str, Any] = QWEN3_8B,
    *,
    algorithm: str = "dflash",
    draft_vocab: int | None = None,
    aux: list[int] | None = None,
    layers: int = 5,
    block_size: int = 16,
    sample_from_anchor: bool | None = None,
    verifier_name: str = "Qwen/Qwen3-8B",
    intermediate: int | None = None,
) -> tuple[dict[str, Any], Tensors]:
    """A DFlash-family draft (dflash, dflash2, dspark) as speculators 0.9.0 writes it."""
    h, v, lv = verifier["hidden_size"], verifier["vocab_size"], verifier["num_hidden_layers"]
    heads, kv, hd = verifier["num_attention_heads"], verifier["num_key_value_heads"], verifier["head_dim"]
    inter = intermediate or verifier["intermediate_size"]
    aux = [2, lv // 2, lv - 3] if aux is None else aux
    vd = v if draft_vocab is None else draft_vocab
    anchor = (algorithm == "dspark") if sample_from_anchor is None else sample_from_anchor
    arch = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel", "dspark": "DSparkDraftModel"}[algorithm]
    config: dict[str, Any] = {
        "architectures": [arch],
        "speculators_model_type": algorithm,
        "speculators_version": "0.9.0",
        "speculators_config": _speculators_config(
            algorithm, block_size if anchor else block_size - 1, verifier_name, verifier["architectures"]
        ),
        "transformer_layer_config": _layer_config("qwen3", h, layers, heads, kv, hd, inter, v),
        "draft_vocab_size": vd,
        "block_size": block_size,
        "aux_hidden_state_layer_ids": aux,
        "mask_token_id": v - 1,
        "sliding_window_non_causal": False,
        "sample_from_anchor": anchor,
        "target_hidden_size": None,
        "dtype": "bfloat16",
    }
    tensors: Tensors = {
        "fc.weight": ("BF16", [h, len(aux) * h]),
        "hidden_norm.weight": ("BF16", [h]),
        "norm.weight": ("BF16", [h]),
    }
    for i in range(layers):
        tensors.update(_decoder_layer(i, h, heads, kv, hd, inter, h, True))
    if vd != v:
        tensors["lm_head.weight"] = ("BF16", [vd, h])
        tensors["d2t"] = ("I64", [vd])
        tensors["t2d"] = ("BOOL", [v])
    if algorithm == "dspark":
        config.update({"markov_rank": 256, "markov_head_type": "vanilla", "enable_confidence_head": True,
                       "confidence_head_with_markov": True})  # fmt: skip
        tensors["markov_head.markov_w1"] = ("BF16", [v, 256])
        tensors["markov_head.markov_w2"] = ("BF16", [vd, 256])
    # speculators writes every layer as a 2048-token sliding window unless told otherwise (--full-attention-indices)
    config["transformer_layer_config"].update(layer_types=["sliding_attention"] * layers, sliding_window=2048)
    if algorithm == "dflash2":
        config.update({"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256, "selector_top_k": 16,
                       "sliding_window_non_causal": True})  # fmt: skip
    return config, tensors


def mutate(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of `config` with the dotted `path` set to `value` (or removed if value is DELETE)."""
    out = copy.deepcopy(config)
    node: Any = out
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node[key]
    last = keys[-1]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return out


DELETE = object()


QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
    "vocab_size": 151936, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",
}  # fmt: skip


def stitched_mtp(config: dict[str, Any] | None = None, layers: int = 1) -> tuple[dict[str, Any], Tensors]:
    """A model with its own MTP layers (what `speculators stitch-mtp` writes): the verifier's config and
    weights (a few stand for all) plus `mtp.*`, shaped as Qwen3-Next publishes them."""
    config = copy.deepcopy(config or QWEN3_NEXT)
    h, v = config["hidden_size"], config["vocab_size"]
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    tensors: Tensors = {
        "model.embed_tokens.weight": ("BF16", [v, h]),
        "model.norm.weight": ("BF16", [h]),
        "lm_head.weight": ("BF16", [v, h]),
        "mtp.fc.weight": ("BF16", [h, 2 * h]),
        "mtp.norm.weight": ("BF16", [h]),
        "mtp.pre_fc_norm_embedding.weight": ("BF16", [h]),
        "mtp.pre_fc_norm_hidden.weight": ("BF16", [h]),
    }
    for i in range(layers):
        p = f"mtp.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": ("BF16", [h]),
            p + "post_attention_layernorm.weight": ("BF16", [h]),
            p + "self_attn.q_proj.weight": ("BF16", [2 * heads * hd, h]),
            p + "self_attn.k_proj.weight": ("BF16", [kv * hd, h]),
            p + "self_attn.v_proj.weight": ("BF16", [kv * hd, h]),
            p + "self_attn.o_proj.weight": ("BF16", [h, heads * hd]),
        }
    return config, tensors
