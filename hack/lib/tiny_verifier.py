"""Make a tiny, random Qwen3 verifier locally (no hub): a byte-level BPE tokenizer trained on generated
sentences and a random Qwen3ForCausalLM saved with save_pretrained. Runs inside the workloads venv
(torch, transformers, tokenizers): `python tiny_verifier.py OUT_DIR`.

Shape (what speculators 0.9.0 and vLLM's CPU build were seen to accept): hidden 128, 8 layers, 2 heads,
1 KV head, head_dim 64, intermediate 256, vocab 512, untied embeddings.
"""

import json
import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

SPECIAL = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def sentences(n: int) -> list[str]:
    rng = random.Random(0)
    subjects = ["the draft", "a verifier", "the operator", "my cluster", "every token", "the scheduler"]
    verbs = ["predicts", "accepts", "rejects", "serves", "trains", "audits", "publishes"]
    objects = ["the next word", "eight tokens", "a checkpoint", "hidden states", "the batch", "a revision"]
    return [
        f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.randint(0, 999)}." for _ in range(n)
    ]


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(sentences(4000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=512,
        hidden_size=128,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=256,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=fast.pad_token_id,
        bos_token_id=None,
        torch_dtype="bfloat16",
    )
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    print(json.dumps({"verifier": str(out), "vocab": len(fast)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
