"""Audit benchmarks (print figures; nothing here is asserted by the test suite).

1. A 17 GB sparse checkpoint on local disk: bytes read versus header + config, wall time in-process.
2. The same audit against the local S3 server (versitygw): ranged requests per safetensors file, and
   the audit's time against downloading the whole checkpoint, measured in the same run.

Run: hack/bench audit   (or: python bench/audit.py --bin-dir DIR, inside the project's venv)
"""

from __future__ import annotations

import argparse
import signal
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import boto3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ckptgen import dflash, eagle3, write_checkpoint

from speculator_harness import LocalCluster
from speculator_operator.adapters.checkpoints import audit, load_checkpoint

BIG_VERIFIER = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 8192, "num_hidden_layers": 64,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600,
    "vocab_size": 151936,
}  # fmt: skip


# a Qwen3-0.6B-shaped verifier: its EAGLE-3 draft is a few hundred MB, worth downloading for comparison
SMALL_VERIFIER = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
    "vocab_size": 151936,
}  # fmt: skip


def header_bytes(folder: Path) -> int:
    total = 0
    for f in folder.glob("*.safetensors"):
        with f.open("rb") as fh:
            total += 8 + struct.unpack("<Q", fh.read(8))[0]
    return total


def bench_local(root: Path, runs: int) -> None:
    folder = root / "big"
    config, tensors = dflash(BIG_VERIFIER, layers=11, draft_vocab=32000)
    write_checkpoint(folder, config, tensors, shards=4)
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    expected = (
        header_bytes(folder)
        + (folder / "config.json").stat().st_size
        + (folder / "model.safetensors.index.json").stat().st_size
    )
    times = []
    report = None
    for _ in range(runs):
        t0 = time.perf_counter()
        report = audit(str(folder), verifier=BIG_VERIFIER)
        times.append(time.perf_counter() - t0)
    assert report is not None
    print(
        f"local sparse checkpoint: {size / 1e9:.1f} GB in {len(report.checkpoint.files)} shards, "
        f"{len(report.checkpoint.tensors)} tensors, audit ok={report.ok}"
    )
    print(f"  bytes read: {report.checkpoint.bytes_read:,} (headers + config + index = {expected:,})")
    print(
        f"  wall time in-process: median {statistics.median(times) * 1000:.1f} ms, "
        f"min {min(times) * 1000:.1f} ms over {runs} runs"
    )


def bench_s3(root: Path, bin_dir: Path, runs: int) -> None:
    local = LocalCluster(root / "s3", bin_dir, log=lambda m: None)
    s3info = local.start_s3_only()
    try:
        import os

        os.environ.update(s3info.env())
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="bench")
        folder = root / "s3ck"
        config, tensors = eagle3(SMALL_VERIFIER, draft_vocab=32000)
        write_checkpoint(folder, config, tensors, shards=2, sparse=False)
        for f in folder.iterdir():
            s3.upload_file(str(f), "bench", f"ck/{f.name}")
        size = sum(f.stat().st_size for f in folder.iterdir())
        audit_times, download_times = [], []
        ck = None
        for _ in range(runs):
            t0 = time.perf_counter()
            ck = load_checkpoint("s3://bench/ck")
            audit(ck, verifier=SMALL_VERIFIER)
            audit_times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for f in folder.iterdir():
                s3.get_object(Bucket="bench", Key=f"ck/{f.name}")["Body"].read()
            download_times.append(time.perf_counter() - t0)
        assert ck is not None
        per_file = {f: ck.source.stats.per_file_requests.get(f, 0) for f in ck.files}
        a, d = statistics.median(audit_times), statistics.median(download_times)
        print(f"S3 (versitygw on 127.0.0.1): checkpoint of {size / 1e6:.0f} MB in {len(ck.files)} shards")
        print(f"  ranged requests per safetensors file: {per_file}; all requests: {ck.source.stats.requests}")
        print(f"  bytes read: {ck.source.stats.bytes_read:,} of {size:,}")
        print(
            f"  audit {a * 1000:.1f} ms vs whole download {d * 1000:.1f} ms (median of {runs}): "
            f"ratio {a / d:.4f} ({d / a:.0f}x faster)"
        )
    finally:
        local.stop()


def main() -> None:
    # a terminated benchmark still stops the processes it started (the finally blocks run)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench_local(Path(tmp), args.runs)
        bench_s3(Path(tmp), args.bin_dir, max(3, args.runs // 4))


if __name__ == "__main__":
    main()
