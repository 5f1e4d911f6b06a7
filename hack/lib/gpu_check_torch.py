"""The torch half of hack/gpu-check, one process for all of it (torch and transformers are imported once, which
is most of the time this takes on a CPU): hack/lib/gpu_check.py starts it with the python that holds torch,

    python gpu_check_torch.py

reads one JSON line from it (the probe: python, torch, its CUDA build, whether CUDA is available, the GPU's name
and memory), then sends requests, one JSON object a line, and reads one answer a line ({"ok": true, "result":
...} or {"ok": false, "error": ...}); closing its stdin ends it. Library output goes to stderr.

{"cmd": "verifier", "out": DIR, "arch": "llama", "hidden": H, "layers": L, "heads": A, "kv_heads": K,
 "intermediate": I, "vocab": V}: a random verifier with no hub: a word-level tokenizer of V tokens (`t4` ...
`t<V-1>` after four special tokens; nothing is ever tokenized from text, but speculators' prepare-data loads a
processor) and a random Llama- or Qwen3-shaped causal LM saved in bfloat16 with save_pretrained.

{"cmd": "hidden-states", "verifier": DIR, "prepared": DIR, "out": DIR, "layers": [2, 4, 5, 8], "device": D}:
what the extract stage has vLLM do (speculators' generate-offline-data against vLLM's `extract_hidden_states`
method with the file connector), without vLLM: for every row i of the prepared dataset, one file
`hs_<i>.safetensors` with `token_ids` (int64 [seq], the row's input_ids) and `hidden_states` ([seq,
len(layers), hidden], the model's dtype). Layer id j < L is the residual stream entering decoder layer j (vLLM's
`hidden_states + residual` before layer j); j == L is the last layer's output before the final norm. Both are
read with forward pre-hooks on the decoder layers and on the final norm, so no transformers convention about
`output_hidden_states` is relied on.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

UNK, PAD, START, END = "<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL = [UNK, PAD, START, END]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def probe() -> dict[str, Any]:
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "python": sys.version.split()[0],
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out |= {"device": props.name, "device_memory_gib": round(props.total_memory / 2**30, 1)}
    return out


def make_verifier(out: Path, arch: str, hidden: int, layers: int, heads: int, kv_heads: int, inter: int,
                  vocab: int) -> dict[str, Any]:  # fmt: skip
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    words = {name: i for i, name in enumerate(SPECIAL)}
    words |= {f"t{i}": i for i in range(len(SPECIAL), vocab)}
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNK, eos_token=END, pad_token=PAD, bos_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        arch,
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=inter,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=words[END],
        pad_token_id=words[PAD],
        bos_token_id=None,
        torch_dtype="bfloat16",
    )
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    params = sum(p.numel() for p in model.parameters())
    return {"verifier": str(out), "arch": arch, "parameters": params, "vocab": vocab}


def _capture_points(model: Any, layers: list[int]) -> tuple[list[Any], dict[int, torch.Tensor]]:
    """Forward pre-hooks that keep the residual stream entering decoder layer j (j < L) and the final norm's
    input (j == L) of the last forward."""
    inner = model.model
    n = len(inner.layers)
    bad = [j for j in layers if not 0 <= j <= n]
    if bad:
        raise SystemExit(f"layer ids {bad} outside 0..{n}")
    seen: dict[int, torch.Tensor] = {}
    handles = []

    def keeper(j: int) -> Any:
        def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen[j] = args[0] if args else kwargs["hidden_states"]

        return hook

    for j in sorted(set(layers)):
        target = inner.norm if j == n else inner.layers[j]
        handles.append(target.register_forward_pre_hook(keeper(j), with_kwargs=True))
    return handles, seen


@torch.no_grad()
def hidden_states(verifier: Path, prepared: Path, out: Path, layers: list[int], device: str,
                  batch_tokens: int) -> dict[str, Any]:  # fmt: skip
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    t0 = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(verifier, dtype=torch.bfloat16).to(device).eval()
    handles, seen = _capture_points(model, layers)
    data = load_from_disk(str(prepared)).with_format(None)
    rows: list[list[int]] = list(data["input_ids"])
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(rows):
        by_length[len(ids)].append(i)
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for length, indices in sorted(by_length.items()):
        per_batch = max(1, batch_tokens // max(length, 1))
        for start in range(0, len(indices), per_batch):
            chunk = indices[start : start + per_batch]
            ids = torch.tensor([rows[i] for i in chunk], dtype=torch.int64)
            seen.clear()
            model(input_ids=ids.to(device), use_cache=False)
            stacked = torch.stack([seen[j] for j in layers], dim=2).to("cpu")  # [batch, seq, layers, hidden]
            for k, i in enumerate(chunk):
                save_file(
                    {"hidden_states": stacked[k].contiguous(), "token_ids": ids[k].clone()},
                    str(out / f"hs_{i}.safetensors"),
                )
                written += 1
    checked = _self_check(model, seen, torch.tensor(rows[0], dtype=torch.int64), out / "hs_0.safetensors", layers,
                          device)  # fmt: skip
    for h in handles:
        h.remove()
    hidden = model.config.hidden_size
    return {"files": written, "rows": len(rows), "layers": layers, "hidden": hidden, "self_check": checked,
            "seconds": round(time.monotonic() - t0, 1)}  # fmt: skip


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


@torch.no_grad()
def _self_check(model: Any, seen: dict[int, torch.Tensor], ids: torch.Tensor, written: Path, layers: list[int],
                device: str) -> dict[str, Any]:  # fmt: skip
    """Row 0, run alone, captured as the files are and run plainly: each id j < L equals transformers'
    hidden_states[j] (the embeddings for 0, else decoder layer j-1's output), and the id L entry put through
    the final norm and the LM head gives the model's own logits (so it is the last layer's output before the
    norm); and hs_0 holds the same tensors (to bf16 rounding: it was computed in a batch). Raises otherwise."""
    from safetensors.torch import load_file

    saved = load_file(str(written))
    if not torch.equal(saved["token_ids"], ids):
        raise AssertionError("hs_0 token_ids are not row 0's input_ids")
    seen.clear()
    plain = model(input_ids=ids[None].to(device), output_hidden_states=True, use_cache=False)
    n = len(model.model.layers)
    semantics = 0.0
    for j in layers:
        if j < n:
            semantics = max(semantics, _relative(seen[j][0], plain.hidden_states[j][0]))
        else:
            logits = model.lm_head(model.model.norm(seen[j]))[0]
            semantics = max(semantics, _relative(logits, plain.logits[0]))
    stored = max(_relative(saved["hidden_states"][:, k], seen[j][0].cpu()) for k, j in enumerate(layers))
    if semantics > 1e-3 or stored > 5e-2:
        raise AssertionError(f"hidden states do not match the plain forward: layer semantics off by {semantics:.2e}, "
                             f"hs_0 off by {stored:.2e} (relative)")  # fmt: skip
    return {"ok": True, "semantics_rel_diff": semantics, "file_rel_diff": stored}


def serve(proto: Any) -> int:
    def answer(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    answer({"probe": probe()})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            if req["cmd"] == "verifier":
                result = make_verifier(Path(req["out"]), req.get("arch", "llama"), req["hidden"], req["layers"],
                                       req["heads"], req["kv_heads"], req["intermediate"], req["vocab"])  # fmt: skip
            elif req["cmd"] == "hidden-states":
                result = hidden_states(
                    Path(req["verifier"]),
                    Path(req["prepared"]),
                    Path(req["out"]),
                    list(req["layers"]),
                    req["device"],
                    int(req.get("batch_tokens", 16384)),
                )
            else:
                raise ValueError(f"unknown request {req.get('cmd')!r}")
        except Exception:
            answer({"ok": False, "error": traceback.format_exc()[-4000:]})
            continue
        answer({"ok": True, "result": result})
    return 0


if __name__ == "__main__":
    # the protocol keeps the real stdout; whatever the libraries print goes to stderr
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.exit(serve(protocol))
