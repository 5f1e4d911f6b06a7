"""Make the demo's models and put them in the local S3 server (bucket `models`, or $DEMO_BUCKET): a small
Qwen3 verifier's config.json, an EAGLE-3 draft for it shaped as speculators 0.9.0 writes one, a copy of the draft
with a broken fc layer, and a few chat rows for the sample train job. Uses the AWS_* variables that
`hack/dev-cluster up` exports."""

import json
import os
import sys
import tempfile
from pathlib import Path

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.ckptgen import SMALL_QWEN3 as VERIFIER
from tests.ckptgen import eagle3, write_checkpoint


def real(verifier: Path, bucket: str) -> None:
    """The real node's part: a tiny verifier with a real tokenizer (hack/lib/tiny_verifier.py made it) and
    pretokenized rows for examples/cpu-node.yaml."""
    s3 = boto3.client("s3")
    for f in sorted(verifier.iterdir()):
        s3.upload_file(str(f), bucket, f"tiny-qwen3-real/{f.name}")
    rows = [
        {"input_ids": [5 + (i * 7 + j) % 500 for j in range(40)], "loss_mask": [0] * 10 + [1] * 30} for i in range(16)
    ]
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    s3.put_object(Bucket=bucket, Key="tiny-qwen3-real-data/rows.jsonl", Body=body)
    print(f"demo: s3://{bucket}/tiny-qwen3-real (a tiny verifier vLLM can serve) and its data", file=sys.stderr)


def main() -> None:
    s3 = boto3.client("s3")
    bucket = os.environ.get("DEMO_BUCKET", "models")
    if len(sys.argv) == 3 and sys.argv[1] == "--real-verifier":
        real(Path(sys.argv[2]), bucket)
        return
    if bucket not in {b["Name"] for b in s3.list_buckets().get("Buckets", [])}:
        s3.create_bucket(Bucket=bucket)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config, tensors = eagle3(VERIFIER, draft_vocab=1024, verifier_name=f"s3://{bucket}/tiny-qwen3")
        write_checkpoint(root / "tiny-qwen3-eagle3", config, tensors, sparse=False)
        broken = dict(tensors)
        broken["fc.weight"] = ("BF16", [256, 512])
        write_checkpoint(root / "tiny-qwen3-eagle3-broken", config, broken, sparse=False)
        (root / "data").mkdir()
        rows = [{"conversations": [{"role": "user", "content": f"question {i}"},
                                   {"role": "assistant", "content": f"answer {i}"}]} for i in range(8)]  # fmt: skip
        (root / "data" / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / "tiny-qwen3").mkdir()
        (root / "tiny-qwen3" / "config.json").write_text(json.dumps(VERIFIER))
        for folder in root.iterdir():
            for f in folder.iterdir():
                s3.upload_file(str(f), bucket, f"{folder.name}/{f.name}")
                print(f"demo: s3://{bucket}/{folder.name}/{f.name}", file=sys.stderr)


if __name__ == "__main__":
    main()
