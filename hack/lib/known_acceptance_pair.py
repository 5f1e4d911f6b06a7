"""A verifier and two EAGLE-3 drafts whose acceptance in vLLM is known by construction, for tests that need
real numbers from real vLLM: `python known_acceptance_pair.py OUT_DIR` inside the workloads venv (torch,
transformers, speculators) writes OUT_DIR/verifier, OUT_DIR/agree and OUT_DIR/disagree.

- the verifier is the tiny Qwen3 of tiny_verifier.py with a zero LM head: every logit is 0, so greedy
  decoding picks token 0 at every step (argmax takes the first of equal values);
- each draft is written by the real `speculators train --dry-run` for that verifier with a pruned draft
  vocabulary (d2t/t2d), and then gets a zero LM head too: it always proposes draft token 0, which its d2t
  maps to target token 0 (`agree`: every drafted token accepted) or to target token 1 (`disagree`: none).
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).parent))
from tiny_verifier import main as make_tiny_verifier

VOCAB, DRAFT_VOCAB = 512, 256


def zero_lm_head(folder: Path) -> None:
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as handle:
            metadata = handle.metadata()
        tensors = load_file(str(f))
        if "lm_head.weight" in tensors:
            tensors["lm_head.weight"] = torch.zeros_like(tensors["lm_head.weight"])
            save_file(tensors, str(f), metadata=metadata)
            return
    raise SystemExit(f"{folder}: no lm_head.weight")


def main(out: Path) -> None:
    verifier = out / "verifier"
    make_tiny_verifier(verifier)
    zero_lm_head(verifier)
    (out / "data").mkdir(exist_ok=True)
    speculators = Path(sys.executable).with_name("speculators")
    for name, first in (("agree", 0), ("disagree", 1)):
        ids = np.arange(first, first + DRAFT_VOCAB)  # draft token i is target token first + i
        t2d = np.zeros(VOCAB, bool)
        t2d[ids] = True
        np.save(out / f"t2d-{name}.npy", t2d)
        np.save(out / f"d2t-{name}.npy", (ids - np.arange(DRAFT_VOCAB)).astype(np.int64))
        subprocess.run(
            [
                str(speculators),
                "train",
                "--dry-run",
                "--speculator-type",
                "eagle3",
                "--save-path",
                str(out / name),
                "--verifier-name-or-path",
                str(verifier),
                "--data-path",
                str(out / "data"),
                "--log-dir",
                str(out / "logs"),
                "--draft-vocab-size",
                str(DRAFT_VOCAB),
                "--d2t-path",
                str(out / f"d2t-{name}.npy"),
                "--t2d-path",
                str(out / f"t2d-{name}.npy"),
            ],
            check=True,
            capture_output=True,
        )
        zero_lm_head(out / name)
    print(json.dumps({"verifier": str(verifier), "agree": str(out / "agree"), "disagree": str(out / "disagree")}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
