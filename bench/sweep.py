"""The throughput-versus-interactivity sweep against the pinned vLLM CPU build, with the tiny real pair whose
acceptance is known by construction (hack/lib/known_acceptance_pair.py). Prints figures; nothing is asserted.

What runs is what a train job's sweep stages run: each server is the rendered evaluation server (its entrypoint,
`speculator-operator serve --speculate`, the audit included) with only K changed, or without a draft, and the client is
the rendered `speculator-operator trainer sweep` command; one server lifetime per K, one after another. Printed: each
server's start and measuring time, the curve (tokens/s, vLLM's inter-token latency, decoding requests per step, per K
and concurrency), the fastest K per concurrency, the crossover, what a deployment on this device class would serve
(domain/sweep.py `choose`, with the release's schedule cost) and the draft's effective cost from the step times.

Run: hack/bench sweep   (BENCH_MAX_CONCURRENCY, default 16; BENCH_ROUNDS, 2; BENCH_MAX_TOKENS, 64; BENCH_K, 3;
BENCH_DRAFT, agree or disagree)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from speculator_harness.cluster import free_port
from speculator_operator.api.podcontract import StageReport
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.releases import get_release
from speculator_operator.domain.sweep import PLAIN, choose
from speculator_operator.planning.measured import effective_cost
from speculator_operator.planning.sweep import curve_of
from speculator_operator.pods.serve import LAUNCHER_ENV, PYTHON_ENV
from speculator_operator.render.training import WORKSPACE, Inputs, server, stages

REPO = Path(__file__).resolve().parents[1]


def env_path(lane: str) -> Path:
    out = subprocess.run([str(REPO / "hack" / "workloads-env"), lane], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def spec(max_concurrency: int, rounds: int, max_tokens: int, k: int) -> SpeculatorTrainJobSpec:
    return SpeculatorTrainJobSpec.model_validate(
        {
            "verifier": {"model": "s3://models/tiny"},
            "output": {"uri": "s3://drafts/tiny"},
            "algorithm": "eagle3",
            "data": {"sources": ["s3://data/rows.jsonl"], "format": "pretokenized", "seqLength": 256},
            "hiddenStates": {"extraArgs": ["--enforce-eager", "--max-model-len", "512"]},
            "evaluation": {
                "heldOut": max_concurrency,
                "maxTokens": max_tokens,
                "numSpeculativeTokens": k,
                "sweep": {"maxConcurrency": max_concurrency, "rounds": rounds, "timeoutSeconds": 3600},
            },
        }
    )


def local(argv: list[str], workspace: Path) -> list[str]:
    return [a.replace(WORKSPACE, str(workspace)) for a in argv]


def start(inputs: Inputs, role: str, workspace: Path, vllm: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The rendered server of `role` on this machine; returns it and its URL once healthy."""
    dep, _ = server(inputs, role)
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    args = local(c["args"], workspace)
    port = free_port()
    args[args.index("--host") + 1] = "127.0.0.1"
    args[args.index("--port") + 1] = str(port)
    exe = str(Path(sys.executable).with_name(c["command"][0]))
    env = {**os.environ, LAUNCHER_ENV: "api-server", PYTHON_ENV: str(vllm / "bin" / "python"),
           "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "OMP_NUM_THREADS": "2",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen([exe, *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench: the {role} server exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:  # noqa: S310 - the bench's own server
                if resp.status == 200:
                    return proc, url
        except OSError:
            pass
        time.sleep(1)
    stop(proc)
    sys.exit(f"bench: the {role} server was not healthy within 600 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", type=Path, help="(unused: no cluster runs here)")
    parser.parse_args()
    max_c = int(os.environ.get("BENCH_MAX_CONCURRENCY", "16"))
    rounds = int(os.environ.get("BENCH_ROUNDS", "2"))
    max_tokens = int(os.environ.get("BENCH_MAX_TOKENS", "64"))
    k = int(os.environ.get("BENCH_K", "3"))
    draft = os.environ.get("BENCH_DRAFT", "agree")
    speculators, vllm = env_path("speculators"), env_path("vllm")
    inputs = Inputs("tiny", "ml", spec(max_c, rounds, max_tokens, k), get_release(), "s3:abc", 8, "uid")
    with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
        root = Path(tmp)
        made = subprocess.run(
            [str(speculators / "bin" / "python"), str(REPO / "hack" / "lib" / "known_acceptance_pair.py"),
             str(root / "pair")], capture_output=True, text=True, check=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )  # fmt: skip
        pair = {key: Path(v) for key, v in json.loads(made.stdout.strip().splitlines()[-1]).items()}
        workspace = root / "ws"
        shutil.copytree(pair["verifier"], workspace / "verifier")
        shutil.copytree(pair[draft], workspace / "checkpoints")
        (workspace / "held-out").mkdir()
        prompts = [{"prompt_token_ids": [5 + (i * 7 + j) % 500 for j in range(10)]} for i in range(max_c)]
        (workspace / "held-out" / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
        planned = [s for s in stages(inputs) if s.name.startswith("sweep-")]
        reports: dict[str, StageReport] = {}
        print(f"sweep: draft {draft}, K={k}, concurrencies up to {max_c}, {rounds} round(s) of {max_tokens} tokens")
        for stage in planned:
            assert stage.server is not None
            t0 = time.monotonic()
            proc, url = start(inputs, stage.server, workspace, vllm, root / f"{stage.server}.log")
            booted = time.monotonic() - t0
            try:
                (c,) = stage.children[0]["spec"]["template"]["spec"]["containers"]
                argv = local([*c["command"], *c["args"]], workspace)
                argv = [a.replace(f"http://tiny-{stage.server}.ml.svc:8000", url) for a in argv]
                argv[0] = str(Path(sys.executable).with_name(argv[0]))
                report = root / f"{stage.name}.report"
                t1 = time.monotonic()
                run = subprocess.run(argv, capture_output=True, text=True,
                                     env={**os.environ, "SPECULATOR_REPORT_PATH": str(report)})  # fmt: skip
                measured = time.monotonic() - t1
            finally:
                stop(proc)
            if run.returncode != 0:
                sys.exit(f"bench: {stage.name} exited {run.returncode}: {run.stderr[-2000:]}")
            reports[stage.name] = StageReport.model_validate_json(report.read_text())
            print(f"  {stage.name}: server ready in {booted:.0f} s, measured in {measured:.0f} s")
        curve = curve_of(reports, stages(inputs)).curve
        assert curve is not None
    release = get_release()
    print(f"device: {curve.device}; vLLM {release.vllm} (CPU build), 2 cores, OMP_NUM_THREADS=2")
    header = "  c  " + "".join(f"| K={kk}: tok/s  ITL ms  batch " for kk in (*curve.ks, PLAIN)) + "| best K"
    print(header)
    for c in curve.concurrencies:
        cells = []
        for kk in (*curve.ks, PLAIN):
            p = curve.at(kk, c)
            cells.append(f"| {p.tokens_per_second:10.1f} {p.itl_ms or 0:7.2f} {p.running or 0:5.2f} ")
        print(f"{c:4d} " + "".join(cells) + f"| {curve.best(c)}")
    print(f"crossover (plain from): {curve.crossover() or 'never'}")
    choice = choose(curve, 256, max(curve.ks), release.schedule_cost)
    served: Any = choice.schedule.as_list() if choice.schedule else f"K={choice.k} at every batch size"
    print(f"a deployment on {curve.device} (maxNumSeqs 256, schedule cost {release.schedule_cost}) serves: {served}")
    print(f"  ({choice.why}; mean throughput {choice.score:.2f}x plain's over the measured concurrencies)")
    cost = effective_cost(curve, "eagle3")
    print(f"effective draft cost from the step times at c={curve.concurrencies[0]}: c = {cost}")


if __name__ == "__main__":
    main()
