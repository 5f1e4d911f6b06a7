"""Write a small draft in a third-party layout, as its own repository publishes it, for `speculators convert`
to turn into speculators' format. Runs inside the workloads venv (torch, safetensors):

    python thirdparty.py {eagle3,dflash,qwen3-next-mtp} OUT --verifier DIR [--break KIND]

The names and shapes are the publishers', as speculators 0.9.0's converters read them
(convert/eagle/eagle3_converter.py, convert/eagle/eagle3_legacy_model.py, convert/dflash/converter.py):

- eagle3, SafeAILab's EAGLE-3: a Llama config with `draft_vocab_size`, one decoder layer under `midlayer.`
  whose attention reads [embedding ‖ hidden] (2H wide), `fc` from the three target layers (3H → H), `norm`,
  `lm_head` over the draft vocabulary, and the `d2t` (draft → target offset) and `t2d` (target mask) maps;
- dflash, z-lab's DFlash: a Qwen3 config with `block_size` and `dflash_config.target_layer_ids` (z-lab's ids:
  speculators adds 1), `layers.N.` with a fused `qkv_proj` (the Laguna variant the converter splits) and the
  Qwen3 q/k norms, `fc` from the target layers, `hidden_norm`, `norm`; no embedding or LM head (borrowed from
  the verifier).

- qwen3-next-mtp, a Qwen3-Next model with its native MTP layer, as Qwen publishes one: a tiny
  Qwen3NextForCausalLM saved by transformers (hybrid linear/full attention, 4 experts; linear-attention head
  dim 128, the one vLLM's CPU kernel takes) and the `mtp.` weights (`fc`, `pre_fc_norm_embedding`,
  `pre_fc_norm_hidden`, `norm`, `layers.0.` a full-attention decoder layer with its experts one by one),
  `num_nextn_predict_layers: 1`; the tokenizer is the tiny verifier's (--verifier). It is both the source of
  `speculators convert --algorithm mtp` and the verifier `stitch-mtp` writes into.

`--break` writes a malformed checkpoint: `missing` drops a tensor the draft needs, `config` a config that
does not fit it (dflash: no `block_size`; eagle3: a head count that does not divide the hidden size).
"""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def _verifier(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _decoder(
    arch: str,
    kind: str,
    hidden: int,
    inter: int,
    layers: int,
    heads: int,
    kv: int,
    head_dim: int,
    vocab: int,
    theta: float,
) -> dict:
    """The decoder part of a draft's config.json, as both publishers write it (a transformers config)."""
    return {
        "architectures": [arch], "model_type": kind, "hidden_size": hidden, "intermediate_size": inter,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": theta,
        "vocab_size": vocab, "torch_dtype": "float32", "tie_word_embeddings": False,
    }  # fmt: skip


def eagle3(verifier: dict, broken: str | None) -> tuple[dict, dict[str, torch.Tensor]]:
    hidden, vocab, draft_vocab = verifier["hidden_size"], verifier["vocab_size"], verifier["vocab_size"] // 2
    heads, kv_heads, head_dim, inter = 2, 1, hidden // 2, 2 * hidden
    config = {
        **_decoder("LlamaForCausalLMEagle3", "llama", hidden, inter, 1, heads, kv_heads, head_dim, vocab, 10000.0),
        "draft_vocab_size": draft_vocab,
    }
    g = torch.Generator().manual_seed(0)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.arange(0, vocab, 2)] = True
    kept = torch.nonzero(t2d).flatten()
    tensors = {
        "midlayer.self_attn.q_proj.weight": w(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": w(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": w(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": w(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": w(inter, hidden),
        "midlayer.mlp.up_proj.weight": w(inter, hidden),
        "midlayer.mlp.down_proj.weight": w(hidden, inter),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "fc.weight": w(hidden, 3 * hidden),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": w(draft_vocab, hidden),
        "d2t": (kept - torch.arange(draft_vocab)).to(torch.int64),
        "t2d": t2d,
    }
    if broken == "missing":
        del tensors["midlayer.self_attn.q_proj.weight"]
    if broken == "config":
        config["num_attention_heads"] = 3  # 128 is no multiple of 3
    return config, tensors


def dflash(verifier: dict, broken: str | None) -> tuple[dict, dict[str, torch.Tensor]]:
    hidden, vocab, layers_verifier = verifier["hidden_size"], verifier["vocab_size"], verifier["num_hidden_layers"]
    heads, kv_heads, head_dim, inter, layers = 2, 1, hidden // 2, 2 * hidden, 2
    target = [1, layers_verifier // 2, layers_verifier - 2]  # z-lab's ids (hidden_states[i + 1])
    config = {
        **_decoder("DFlashDraftModel", "qwen3", hidden, inter, layers, heads, kv_heads, head_dim, vocab, 1000000.0),
        "block_size": 8,
        "num_target_layers": layers_verifier,
        "dflash_config": {"target_layer_ids": target, "mask_token_id": vocab - 1},
    }
    g = torch.Generator().manual_seed(1)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.02

    tensors: dict[str, torch.Tensor] = {}
    for i in range(layers):
        p = f"layers.{i}."
        tensors |= {
            p + "self_attn.qkv_proj.weight": w((heads + 2 * kv_heads) * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": torch.ones(head_dim),
            p + "self_attn.k_norm.weight": torch.ones(head_dim),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        }
    tensors |= {
        "fc.weight": w(hidden, len(target) * hidden),
        "hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
    }
    if broken == "missing":
        del tensors["layers.1.mlp.down_proj.weight"]
    if broken == "config":
        del config["block_size"]
    return config, tensors


def qwen3_next_mtp(tokenizer: Path, out: Path, broken: str | None) -> None:
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next import modeling_qwen3_next as qwen3_next

    config = Qwen3NextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, layer_types=["linear_attention", "full_attention"] * 2,
        linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=128, linear_value_head_dim=128,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        decoder_sparse_step=1, max_position_embeddings=512, tie_word_embeddings=False, num_nextn_predict_layers=1,
        eos_token_id=3,
    )  # fmt: skip
    torch.manual_seed(0)
    qwen3_next.Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    for f in tokenizer.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            (out / f.name).write_bytes(f.read_bytes())
    layer = qwen3_next.Qwen3NextDecoderLayer(config, 3).state_dict()
    hidden = config.hidden_size
    mtp = {
        f"mtp.layers.0.{k}": v
        for k, v in layer.items()
        if not k.endswith(("experts.gate_up_proj", "experts.down_proj"))
    }
    for name in [k for k in layer if k.endswith("experts.gate_up_proj")]:  # one tensor per expert, as published
        prefix = "mtp.layers.0." + name.removesuffix("gate_up_proj")
        gate_up, down = layer[name], layer[name.replace("gate_up_proj", "down_proj")]
        half = gate_up.shape[1] // 2
        for i in range(gate_up.shape[0]):
            mtp[f"{prefix}{i}.gate_proj.weight"] = gate_up[i, :half]
            mtp[f"{prefix}{i}.up_proj.weight"] = gate_up[i, half:]
            mtp[f"{prefix}{i}.down_proj.weight"] = down[i]
    g = torch.Generator().manual_seed(2)
    mtp |= {
        "mtp.fc.weight": torch.randn(hidden, 2 * hidden, generator=g) * 0.02,
        "mtp.norm.weight": torch.ones(hidden),
        "mtp.pre_fc_norm_hidden.weight": torch.ones(hidden),
        "mtp.pre_fc_norm_embedding.weight": torch.ones(hidden),
    }
    if broken == "missing":
        del mtp["mtp.fc.weight"]
    weights = load_file(str(out / "model.safetensors"))
    weights |= {k: v.to(torch.bfloat16).contiguous() for k, v in mtp.items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("layout", choices=("eagle3", "dflash", "qwen3-next-mtp"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--verifier", type=Path, required=True)
    parser.add_argument("--break", dest="broken", choices=("missing", "config"))
    args = parser.parse_args()
    if args.layout == "qwen3-next-mtp":
        qwen3_next_mtp(args.verifier, args.out, args.broken)
        return
    build = eagle3 if args.layout == "eagle3" else dflash
    config, tensors = build(_verifier(args.verifier), args.broken)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(args.out / "model.safetensors"))


if __name__ == "__main__":
    main()
