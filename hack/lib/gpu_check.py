"""hack/gpu-check: a few hundred EAGLE-3 training steps on one GPU through the trainer stage's own code, on a
machine that has PyTorch but no vLLM and no package registry (docs/development/gpu-check.md).

    hack/gpu-check --prepare                    # here: download the wheels the GPU machine lacks into .whl/
    hack/gpu-check --wheels .whl --device cuda  # there: install them into a temporary folder, then run
    hack/gpu-check --device cpu                 # anywhere: the same path on the CPU, a few steps

What it does, stage by stage as a SpeculatorTrainJob would (the stages are rendered by the operator's own
render.training from a TrainJob spec; each stage's container command runs with the workspace mount made a
local folder):
  fetch    replaced: a random verifier made here (hack/lib/gpu_check_torch.py) and synthetic pretokenized
           rows, written where the rendered fetch command puts the verifier and the data;
  prepare  the rendered command through the trainer entry (`trainer run --stage prepare`: prepare-data);
  extract  replaced: there is no vLLM, so the verifier runs here and writes hs_<i>.safetensors for every
           prepared row, the layout and layers vLLM's extract_hidden_states would (gpu_check_torch.py);
  train    the rendered command through the trainer entry (`trainer run --stage train`: torchrun -m
           speculators.train --on-missing raise), timed and with its losses read from its output;
  audit    the rendered command (`trainer audit`): the trained checkpoint against the verifier and release.
Publish (to S3) is left out.

Exit codes: 0 pass; 2 usage; 3 CUDA asked for and not available; 4 install failure (the carried wheels do
not install or a needed package is missing); 5 setup failure (verifier, prepare or hidden states); 6 the
train stage failed, was stopped by --train-timeout, or logged no loss; 7 the loss did not fall; 8 the audit
of the trained draft failed; 9 stopped by SIGTERM (a time limit around the check).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TORCH_HELPER = REPO / "hack" / "lib" / "gpu_check_torch.py"
SITE_HOOKS = REPO / "hack" / "lib" / "gpu_check_site"

EXIT_OK, EXIT_USAGE, EXIT_NO_CUDA, EXIT_INSTALL, EXIT_SETUP, EXIT_TRAIN, EXIT_LOSS, EXIT_AUDIT = 0, 2, 3, 4, 5, 6, 7, 8
EXIT_STOPPED = 9
MIB = 2**20
CARRY_LIMIT = 64 * MIB  # what travels to the GPU machine: the working tree and the carried wheels together
# on the CPU only (speculators' defaults need CUDA: flex attention has no CPU backward, the fused loss is
# Triton); no DataLoader worker processes (each one imports torch again, which costs more than it saves here)
CPU_TRAIN_ARGS = ["--num-workers", "0", "--draft-attn-impl", "sdpa", "--loss-implementation", "eager"]
SHM_NEEDED = 4 * 2**30
LAUNCH = "import sys; from speculator_operator.cli import main; sys.exit(main(sys.argv[1:]))"


class Failed(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Size:
    """The verifier, the data and the run. `rows` of exactly `row_length` tokens, packed `seq_length //
    row_length` to a step; the epochs are chosen to reach about `steps` steps."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    draft_vocab: int
    rows: int
    row_length: int
    seq_length: int
    steps: int
    lr: float | None


SIZES = {
    # Llama-shaped, 8 layers (speculators' default target layers [2, L//2, L-3] need L >= 7), a 32k vocabulary
    # pruned to 8k for the draft: about 160M verifier parameters; ~360 steps of 4 x 512 tokens
    "cuda": Size(1024, 8, 8, 2, 2816, 32000, 8192, rows=400, row_length=512, seq_length=2048, steps=300, lr=None),
    # the shape the workloads lane's tiny verifier has, a few steps at a higher learning rate
    "cpu": Size(128, 8, 2, 1, 256, 512, 256, rows=40, row_length=64, seq_length=256, steps=8, lr=1e-2),
}

# The packages the lent GPU machine's image holds (its published package list, read 2026-11-17): a requirement
# of speculators found here is not carried. Versions where the image's list gives them (checked against the
# carried packages' requirements at --prepare).
DEVICE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions
typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split()  # noqa: SIM905 - the list as published, one name after another
DEVICE_VERSIONS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "tokenizers": "0.23.2", "torch": "2.11.0", "torchaudio": "2.11.0", "torchvision": "0.26.0",
    "transformers": "5.17.0", "triton": "3.6.0",
}  # fmt: skip
DEVICE_PYTHON = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_24_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64"]  # fmt: skip


def log(message: str) -> None:
    print(f"gpu-check: {message}", flush=True)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------------------------------------
# --prepare (here, with registry access): the wheels the GPU machine lacks


def prepare_wheels(dest: Path, also: list[str]) -> int:
    """Download speculators and hs-connectors at the release's pins and, recursively, every requirement of
    theirs the GPU machine's image does not hold, at the version installed in this environment (the
    workloads lane's, so the GPU run uses what CI tests), for CPython 3.12 on manylinux x86-64. `also`: more
    packages to carry (NAME or NAME==VERSION), for a requirement the GPU run found unmet there."""
    import zipfile
    from importlib import metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.version import Version

    sys.path.insert(0, str(REPO / "operator"))
    from speculator_operator.domain.releases import get_release

    release = get_release()
    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    env |= {"python_version": DEVICE_PYTHON, "python_full_version": f"{DEVICE_PYTHON}.3", "sys_platform": "linux",
            "platform_machine": "x86_64", "extra": ""}  # fmt: skip
    on_device = {normalize(n) for n in DEVICE_PACKAGES}
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    wanted: list[str] = [f"speculators=={release.speculators}", f"hs-connectors=={release.hs_connectors}"]
    for extra in also:
        if "==" in extra:
            wanted.append(extra)
        else:
            try:
                wanted.append(f"{extra}=={metadata.version(extra)}")
            except metadata.PackageNotFoundError:
                wanted.append(extra)
        on_device.discard(normalize(Requirement(extra).name))
    seen: set[str] = set()
    conflicts: list[str] = []
    unverified: set[str] = set()
    while wanted:
        spec = wanted.pop(0)
        name = normalize(Requirement(spec).name)
        if name in seen:
            continue
        seen.add(name)
        before = set(dest.iterdir())
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--python-version", DEVICE_PYTHON, "--implementation", "cp",
               "-d", str(dest), "-q", spec]  # fmt: skip
        for platform in PLATFORMS:
            cmd += ["--platform", platform]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            log(f"--prepare: pip download {spec} failed:\n{result.stderr[-2000:]}")
            return EXIT_INSTALL
        (wheel,) = set(dest.iterdir()) - before or {next(dest.glob(f"{name.replace('-', '_')}-*.whl"))}
        with zipfile.ZipFile(wheel) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            text = zf.read(meta).decode()
        log(f"--prepare: {wheel.name} ({wheel.stat().st_size / MIB:.1f} MiB)")
        for line in text.splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = normalize(req.name)
            if dep in on_device:
                have = DEVICE_VERSIONS.get(dep)
                if have and req.specifier and not req.specifier.contains(Version(have), prereleases=True):
                    conflicts.append(f"{name} needs {req}, the GPU machine has {dep} {have}")
                elif not have and req.specifier:
                    unverified.add(f"{req.name}{req.specifier}")
                continue
            if dep in seen:
                continue
            try:
                installed = metadata.version(dep)
                wanted.append(f"{dep}=={installed}")
            except metadata.PackageNotFoundError:
                wanted.append(str(req.name) + str(req.specifier))
    total = sum(p.stat().st_size for p in dest.glob("*.whl"))
    tree = _tree_bytes()
    log(f"--prepare: {len(list(dest.glob('*.whl')))} wheels, {total / MIB:.1f} MiB, into {dest}; the working "
        f"tree that travels with them: {tree / MIB:.1f} MiB (limit {CARRY_LIMIT / MIB:.0f} MiB together)")  # fmt: skip
    for c in conflicts:
        log(f"--prepare: warning: {c} (carry it with --also NAME)")
    if unverified:
        log(f"--prepare: requirements on the GPU machine's own packages, its versions unknown here (the GPU run "
            f"checks them first): {', '.join(sorted(unverified))}")  # fmt: skip
    if total + tree > CARRY_LIMIT:
        log("--prepare: too large to carry")
        return EXIT_INSTALL
    return EXIT_OK


def _tree_bytes() -> int:
    """Tracked and untracked-not-ignored files: what travels to the GPU machine besides the carried paths."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=False)  # fmt: skip
    total = 0
    for name in out.stdout.decode(errors="replace").split("\0"):
        p = REPO / name
        if name and p.is_file():
            total += p.stat().st_size
    return total


# ---------------------------------------------------------------------------------------------------------
# the run


def install_wheels(wheels: Path, site: Path) -> None:
    found = sorted(wheels.glob("*.whl"))
    if not found:
        raise Failed(EXIT_INSTALL, f"no wheels in {wheels} (run hack/gpu-check --prepare where pip can download)")
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                             "--no-cache-dir", "--disable-pip-version-check", "--upgrade", "--target", str(site),
                             *map(str, found)], capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        raise Failed(EXIT_INSTALL, f"pip install of the carried wheels failed:\n{result.stderr[-3000:]}")
    log(f"installed {len(found)} carried wheels into {site} ({time.monotonic() - t0:.1f} s)")


NEEDED = (
    "speculators",
    "hs-connectors",
    "transformers",
    "tokenizers",
    "datasets",
    "safetensors",
    "pydantic",
    "packaging",
    "numpy",
    "torch",
)


def distributions(site: Path | None) -> dict[str, Any]:
    """What this Python finds (the carried wheels first): the versions of what the check needs, what is
    missing, and the requirements of speculators and of every carried package that what is found does not
    meet (reported, not fatal: a pin is not always a break)."""
    from importlib import metadata

    out: dict[str, Any] = {"versions": {}, "missing": [], "conflicts": []}
    for name in NEEDED:
        try:
            out["versions"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out["missing"].append(name)
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version

        checked = list(metadata.distributions(path=[str(site)])) if site else []
        names = {normalize(d.metadata["Name"]) for d in checked}
        if "speculators" not in names:
            with contextlib.suppress(metadata.PackageNotFoundError):
                checked.append(metadata.distribution("speculators"))
        for dist in checked:
            for line in dist.requires or []:
                req = Requirement(line)
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
                try:
                    have = metadata.version(req.name)
                except metadata.PackageNotFoundError:
                    if normalize(req.name) not in ("torchaudio", "torchvision"):  # neither is imported to train
                        out["conflicts"].append(f"{dist.metadata['Name']} needs {req} (not installed)")
                    continue
                if req.specifier and not req.specifier.contains(Version(have), prereleases=True):
                    out["conflicts"].append(f"{dist.metadata['Name']} needs {req} (found {have})")
    except Exception as exc:  # a report only
        out["conflicts"].append(f"could not check the requirements: {exc}")
    return out


class TorchHelper:
    """hack/lib/gpu_check_torch.py, started once: its probe, then requests and answers (one JSON line each)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log = log_path.open("w")
        self.proc = subprocess.Popen([sys.executable, str(TORCH_HELPER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)  # fmt: skip
        self.log_path = log_path
        first = self._read()
        if first is None or "probe" not in first:
            self.close()
            raise Failed(EXIT_INSTALL, f"the torch helper did not start:\n{tail(log_path)}")
        self.probe: dict[str, Any] = first["probe"]

    def _read(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def ask(self, code: int, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if answer is None:
            raise Failed(code, f"the torch helper stopped during {request['cmd']}:\n{tail(self.log_path)}")
        if not answer["ok"]:
            raise Failed(code, f"{request['cmd']} failed:\n{answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    def close(self) -> None:
        """Ends it (and with it whatever it held of the GPU) before the train stage starts."""
        if self.log.closed:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


Rendered = tuple[dict[str, list[str]], dict[str, list[str]], dict[str, dict[str, str]], list[int]]


def render_stages(size: Size, epochs: int, extra_train: list[str]) -> Rendered:
    """The TrainJob's stages as the operator renders them: each stage's container argv and env (with the
    workspace mount still in them), its tool command, and the layers the extraction server would be asked for."""
    from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
    from speculator_operator.domain.releases import get_release
    from speculator_operator.render.training import Inputs, server_args, stages

    spec = {
        "verifier": {"model": "s3://gpu-check/verifier"},
        "output": {"uri": "s3://gpu-check/draft"},
        "algorithm": "eagle3",
        "draft": {"draftVocabSize": size.draft_vocab},
        "data": {"sources": ["s3://gpu-check/rows.jsonl"], "format": "pretokenized", "seqLength": size.seq_length},
        "training": {"epochs": epochs, **({"lr": size.lr} if size.lr else {}), "extraArgs": extra_train},
    }
    inputs = Inputs("gpu-check", "default", SpeculatorTrainJobSpec.model_validate(spec), get_release(), "local",
                    size.layers, "gpu-check")  # fmt: skip
    argv: dict[str, list[str]] = {}
    tools: dict[str, list[str]] = {}
    envs: dict[str, dict[str, str]] = {}
    for stage in stages(inputs):
        (c,) = stage.children[0]["spec"]["template"]["spec"]["containers"]
        argv[stage.name] = [*c["command"], *c["args"]]
        tools[stage.name] = list(stage.command)
        envs[stage.name] = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    args = server_args(inputs, "extractor")
    speculative = json.loads(args[args.index("--speculative-config") + 1])
    layers = speculative["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
    return argv, tools, envs, layers


def _shm_free() -> int | None:
    try:
        return shutil.disk_usage("/dev/shm").free  # noqa: S108 - where the DataLoader workers hand batches over
    except OSError:
        return None


def flag(command: list[str], name: str) -> str:
    i = command.index(name)
    return command[i + 1]


def synthetic_rows(path: Path, size: Size) -> None:
    """Pretokenized rows of exactly row_length tokens: ids from the non-special vocabulary with a Zipf-like
    frequency (so the pruned draft vocabulary keeps the frequent ones), the first quarter a prompt (loss 0)."""
    rng = random.Random(0)  # noqa: S311 - seeded test data
    ids = list(range(4, size.vocab))
    weights = [1.0 / (rank + 10) for rank in range(len(ids))]
    rng.shuffle(ids)
    prompt = size.row_length // 4
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for _ in range(size.rows):
            row = rng.choices(ids, weights=weights, k=size.row_length)
            mask = [0] * prompt + [1] * (size.row_length - prompt)
            fh.write(json.dumps({"input_ids": row, "loss_mask": mask}) + "\n")


@dataclass
class StageRun:
    code: int
    seconds: float
    log: Path
    stopped: bool = False  # by --train-timeout


_RUNNING: list[subprocess.Popen[str]] = []  # the stage running now: a SIGTERM to this script stops it too


def _stop(proc: subprocess.Popen[str], stopped: list[bool]) -> None:
    """SIGTERM (the trainer entry hands it to the tool, which saves `interrupted/`), then SIGKILL."""
    stopped.append(True)
    proc.terminate()
    try:
        proc.wait(timeout=150)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_stage(name: str, argv: list[str], env: dict[str, str], logs: Path, cwd: Path,
              on_line: Any = None, timeout: float | None = None) -> StageRun:  # fmt: skip
    """One rendered container command, `speculator-operator ...` run as this Python's module entry; its
    output goes to logs/<name>.log, each line also to on_line; stopped after `timeout` seconds."""
    if argv[0] == "speculator-operator":
        argv = [sys.executable, "-c", LAUNCH, *argv[1:]]
    path = logs / f"{name}.log"
    t0 = time.monotonic()
    stopped: list[bool] = []
    with path.open("w") as out:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
        _RUNNING.append(proc)
        timer = threading.Timer(timeout, _stop, (proc, stopped)) if timeout else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.write(line)
                if on_line is not None:
                    on_line(line)
            code = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            _RUNNING.remove(proc)
    return StageRun(code, time.monotonic() - t0, path, bool(stopped))


def _on_sigterm(_signum: int, _frame: Any) -> None:
    for proc in list(_RUNNING):
        proc.terminate()
    raise Failed(EXIT_STOPPED, "stopped by SIGTERM (a time limit around the check)")


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


_STEP = re.compile(r"\bglobal_step=(\d+)")
_LOSS = re.compile(r"(?:^|[\s,])train/loss=(-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf)")
_STEP_MS = re.compile(r"profile/step_ms=(-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)")
_TOKENS_S = re.compile(r"profile/tokens_per_s=(-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?)")


class TrainWatch:
    """What the train stage's output says: (step, loss, arrival time) per logged step, and speculators' own
    per-step profile (step_ms, tokens_per_s: timed with the accelerator synchronized)."""

    def __init__(self) -> None:
        self.points: list[tuple[int, float, float]] = []
        self.step_ms: list[float] = []
        self.tokens_per_s: list[float] = []

    def __call__(self, line: str) -> None:
        step, loss = _STEP.search(line), _LOSS.search(line)
        if step and loss:
            self.points.append((int(step[1]), float(loss[1]), time.monotonic()))
            ms, tok = _STEP_MS.search(line), _TOKENS_S.search(line)
            if ms:
                self.step_ms.append(float(ms[1]))
            if tok:
                self.tokens_per_s.append(float(tok[1]))

    def rate(self) -> float | None:
        """Steps per second from the median time between consecutive logged steps, the first tenth (compiling,
        warming up) left out; the median leaves out the epoch ends too (checkpoint, validation)."""
        pts = self.points[len(self.points) // 10 :]
        gaps = [(b[2] - a[2]) / (b[0] - a[0]) for a, b in itertools.pairwise(pts) if b[0] > a[0]]
        gaps = [g for g in gaps if g > 0]
        return 1 / statistics.median(gaps) if gaps else None


def loss_verdict(points: list[tuple[int, float, float]], min_drop: float) -> dict[str, Any]:
    """Start and end: the mean of the first and the last tenth of the logged losses (at least 3 each); the
    loss falls when the end is below the start by min_drop of it."""
    losses = [p[1] for p in points if math.isfinite(p[1])]
    k = max(3, len(losses) // 10)
    if len(losses) < 2 * k:
        return {"ok": False, "reason": f"{len(losses)} finite losses logged, too few to compare"}
    start, end = statistics.fmean(losses[:k]), statistics.fmean(losses[-k:])
    drop = (start - end) / start if start > 0 else 0.0
    return {"ok": drop >= min_drop, "start": round(start, 4), "end": round(end, 4), "drop": round(drop, 3),
            "window": k, "min_drop": min_drop,
            "reason": f"loss {start:.4f} -> {end:.4f} ({drop:.1%} lower; needs {min_drop:.0%})"}  # fmt: skip


def read_memory(prefix: Path) -> dict[str, float]:
    """The peak memory the trainer's processes wrote at exit (hack/lib/gpu_check_site): the largest of each."""
    peak: dict[str, float] = {}
    for p in prefix.parent.glob(prefix.name + ".*.json"):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        for key, value in data.items():
            if isinstance(value, int | float) and key != "pid":
                peak[key] = max(peak.get(key, 0.0), float(value))
    return peak


def check(a: argparse.Namespace) -> int:
    device = a.device
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    out = Path(a.out) if a.out else work / "out"
    logs = out
    logs.mkdir(parents=True, exist_ok=True)
    workspace = work / "workspace"
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir(parents=True)
    result: dict[str, Any] = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "command": sys.argv[1:]}
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _check(a, device, work, workspace, logs, result)
    except Failed as exc:
        result |= {"ok": False, "exit": exc.code, "failure": str(exc)}
        log(f"FAILED (exit {exc.code}): {exc}")
        return exc.code
    finally:
        (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        log(f"result: {out / 'result.json'}")
        if not a.keep and not a.work:
            shutil.rmtree(workspace, ignore_errors=True)


def _check(a: argparse.Namespace, device: str, work: Path, workspace: Path, logs: Path,
           result: dict[str, Any]) -> int:  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1", "COLUMNS": "1000"}  # fmt: skip
    paths = [str(REPO / "operator")]
    bins = [str(Path(sys.executable).parent)]
    site = None
    if a.wheels:
        site = work / "site"
        install_wheels(Path(a.wheels), site)
        paths.insert(0, str(site))
        bins.insert(0, str(site / "bin"))
    for p in reversed(paths):
        sys.path.insert(0, p)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([*bins, env.get("PATH", "")])

    found = distributions(site)
    result["environment"] = {"python": sys.version.split()[0], **found}
    log(f"python {sys.version.split()[0]}: {', '.join(f'{k} {v}' for k, v in found['versions'].items())}")
    for c in found["conflicts"]:
        log(f"warning: {c}; if it breaks, carry the package: hack/gpu-check --prepare --also NAME")
    if found["missing"]:
        raise Failed(EXIT_INSTALL, f"missing here: {', '.join(found['missing'])}")
    if device == "cpu":
        # the CPU sizes are tiny: a second thread per process only waits (and on a busy machine, spins)
        env.setdefault("OMP_NUM_THREADS", "1")
    helper = TorchHelper(env, logs / "torch-helper.log")
    try:
        return _run(a, device, helper, env, work, workspace, logs, result)
    finally:
        helper.close()


def _run(a: argparse.Namespace, device: str, helper: TorchHelper, env: dict[str, str], work: Path, workspace: Path,
         logs: Path, result: dict[str, Any]) -> int:  # fmt: skip
    info = helper.probe
    result["environment"] |= {"torch": info["torch"], "cuda_build": info["cuda_build"]}
    if device == "auto":
        device = "cuda" if info["cuda_available"] else "cpu"
        if device == "cpu":
            env.setdefault("OMP_NUM_THREADS", "1")
    if device == "cuda" and not info["cuda_available"]:
        raise Failed(EXIT_NO_CUDA, f"--device cuda: torch {info['torch']} sees no CUDA device")
    result["device"] = f"{info['device']} ({info['device_memory_gib']} GiB)" if device == "cuda" else "cpu"
    log(f"device: {result['device']}, torch {info['torch']} (CUDA build {info['cuda_build']})")

    base = SIZES[a.size or device]
    size = Size(**{**base.__dict__, **{k: v for k, v in {
        "rows": a.rows, "steps": a.steps, "lr": a.lr}.items() if v is not None}})  # fmt: skip
    per_step = max(1, size.seq_length // size.row_length)
    steps_per_epoch = max(1, math.ceil(int(size.rows * 0.9) / per_step))  # speculators keeps 0.9 to train on
    epochs = max(1, math.ceil(size.steps / steps_per_epoch))
    extra = CPU_TRAIN_ARGS if device == "cpu" else []
    shm = _shm_free()
    if device == "cuda" and shm is not None and shm < SHM_NEEDED:
        # speculators' DataLoader workers (12, spawned) hand batches over in /dev/shm; the trainer pod mounts a
        # 16 GiB memory volume there. Less here: fewer workers, said in the result
        extra = ["--num-workers", "2", "--prefetch-factor", "2"]
        log(f"warning: /dev/shm has {shm / 2**30:.1f} GiB free: {' '.join(extra)}")
        result["adapted"] = {"shm_free_gib": round(shm / 2**30, 1), "train_args": extra}
    try:
        argv, tools, envs, layers = render_stages(size, epochs, extra)
    except ImportError as exc:
        raise Failed(EXIT_INSTALL, f"the operator's own code does not import: {exc}") from exc
    result["size"] = {**size.__dict__, "epochs": epochs, "rows_per_step": per_step}

    def local(args: list[str]) -> list[str]:
        return [x.replace("/workspace", str(workspace)) for x in args]

    def stage_env(name: str) -> dict[str, str]:
        extra_env = {k: v.replace("/workspace", str(workspace)) for k, v in envs.get(name, {}).items()}
        reports = work / "reports"
        reports.mkdir(exist_ok=True)
        return {**env, **extra_env, "SPECULATOR_REPORT_PATH": str(reports / f"{name}.json")}

    # fetch, replaced: the verifier and the rows where the rendered fetch command puts them
    fetch = local(argv["fetch"])
    verifier = Path(flag(fetch, "--dest"))
    rows = Path(flag(fetch, "--data").split("=", 1)[1])
    t0 = time.monotonic()
    result["verifier"] = helper.ask(EXIT_SETUP, cmd="verifier", out=str(verifier), arch="llama", hidden=size.hidden,
                                    layers=size.layers, heads=size.heads, kv_heads=size.kv_heads,
                                    intermediate=size.intermediate, vocab=size.vocab)  # fmt: skip
    synthetic_rows(rows, size)
    log(f"verifier: llama, hidden {size.hidden} x {size.layers} layers, vocab {size.vocab}, "
        f"{result['verifier']['parameters'] / 1e6:.1f}M parameters; {size.rows} rows of {size.row_length} tokens "
        f"({time.monotonic() - t0:.1f} s)")  # fmt: skip

    # prepare: the rendered stage through the trainer entry
    ran = run_stage("prepare", local(argv["prepare"]), stage_env("prepare"), logs, work)
    if ran.code != 0:
        text = tail(ran.log)
        code = EXIT_INSTALL if re.search(r"ModuleNotFoundError|ImportError", text) else EXIT_SETUP
        raise Failed(code, f"the prepare stage exited {ran.code}:\n{text}")
    log(f"prepare: trainer run --stage prepare ({' '.join(tools['prepare'][:2])}) ({ran.seconds:.1f} s)")

    # extract, replaced: the verifier's hidden states in the files the train stage reads
    prepared = Path(flag(local(tools["prepare"]), "--output"))
    hs_dir = Path(flag(local(tools["extract"]), "--output"))
    t0 = time.monotonic()
    result["hidden_states"] = helper.ask(
        EXIT_SETUP,
        cmd="hidden-states",
        verifier=str(verifier),
        prepared=str(prepared),
        out=str(hs_dir),
        layers=layers,
        device=device,
    )
    helper.close()
    log(f"hidden states: {result['hidden_states']['files']} files, layers {layers} "
        f"({time.monotonic() - t0:.1f} s)")  # fmt: skip

    # train: the rendered stage through the trainer entry
    memory = work / "memory" / "train"
    shutil.rmtree(memory.parent, ignore_errors=True)
    memory.parent.mkdir(parents=True)
    train_env = stage_env("train")
    train_env["PYTHONPATH"] = os.pathsep.join([str(SITE_HOOKS), train_env["PYTHONPATH"]])
    train_env["SPECULATOR_GPU_CHECK_MEMORY"] = str(memory)
    if device == "cpu":
        train_env["SPECULATOR_GPU_CHECK_CPU"] = "1"
    watch = TrainWatch()
    log(f"train: {' '.join(tools['train'])}")
    ran = run_stage("train", local(argv["train"]), train_env, logs, work, on_line=watch, timeout=a.train_timeout)
    peak = read_memory(memory)
    steps = watch.points[-1][0] + 1 if watch.points else 0
    wall_rate = watch.rate()
    step_ms = statistics.median(watch.step_ms[len(watch.step_ms) // 10 :]) if watch.step_ms else None
    result["train"] = {
        "exit": ran.code, "seconds": round(ran.seconds, 1), "steps": steps,
        "steps_per_s_wall": round(wall_rate, 2) if wall_rate else None,
        "steps_per_s_overall": round(steps / ran.seconds, 2) if ran.seconds else None,
        "median_step_ms": round(step_ms, 2) if step_ms else None,
        "steps_per_s_profile": round(1000 / step_ms, 2) if step_ms else None,
        "median_tokens_per_s": round(statistics.median(watch.tokens_per_s)) if watch.tokens_per_s else None,
        "peak_memory_mib": peak,
    }  # fmt: skip
    report_file = work / "reports" / "train.json"
    if report_file.is_file():
        result["train"]["stage_report"] = json.loads(report_file.read_text())
    verdict = loss_verdict(watch.points, a.min_drop)
    result["loss"] = verdict
    if ran.stopped:
        result["train"]["stopped_after_s"] = a.train_timeout
        raise Failed(EXIT_TRAIN, f"the train stage was stopped after {a.train_timeout:.0f} s (--train-timeout) at "
                                 f"step {steps}: {_figures(result, verdict)}")  # fmt: skip
    if ran.code != 0:
        raise Failed(EXIT_TRAIN, f"the train stage exited {ran.code}:\n{tail(ran.log)}")
    if "start" not in verdict:
        raise Failed(EXIT_TRAIN, f"the train stage logged no usable loss: {verdict['reason']}")
    log(f"train: {_figures(result, verdict)}")

    # audit: the rendered stage through the trainer entry
    ran = run_stage("audit", local(argv["audit"]), stage_env("audit"), logs, work)
    result["audit"] = {"exit": ran.code}
    audit_report = work / "reports" / "audit.json"
    if audit_report.is_file():
        result["audit"]["report"] = json.loads(audit_report.read_text())
    if ran.code != 0:
        raise Failed(EXIT_AUDIT, f"the audit stage exited {ran.code}:\n{tail(ran.log, 20)}")
    log("audit: the trained draft passes the audit against the verifier and the release")
    if not verdict["ok"]:
        raise Failed(EXIT_LOSS, f"the loss did not fall enough: {verdict['reason']}")
    result |= {"ok": True, "exit": EXIT_OK}
    log("PASS")
    return EXIT_OK


def _figures(result: dict[str, Any], verdict: dict[str, Any]) -> str:
    train = result["train"]
    peak = train["peak_memory_mib"]
    if "cuda_max_allocated_mib" in peak:
        mem = (f"peak CUDA memory {peak['cuda_max_allocated_mib']:.0f} MiB allocated, "
               f"{peak.get('cuda_max_reserved_mib', 0):.0f} MiB reserved")  # fmt: skip
    else:
        mem = f"peak RSS {peak.get('max_rss_mib', 0):.0f} MiB"
    return (f"{train['steps']} steps in {train['seconds']:.1f} s (the stage, start-up included); "
            f"{train['steps_per_s_wall']} steps/s (wall, median step); {train['steps_per_s_profile']} steps/s "
            f"(speculators' profile, median {train['median_step_ms']} ms); {mem}; {verdict['reason']}")  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hack/gpu-check", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--prepare", action="store_true", help="download the wheels the GPU machine lacks into --wheels")
    p.add_argument("--wheels", help="folder of carried wheels to install first (--prepare: where to download)")
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME[==VERSION]",
        help="--prepare: carry this package too (one the GPU machine has at a version that does not fit)",
    )
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument(
        "--size", choices=sorted(SIZES), help="the verifier and data of this device (default: the device's own)"
    )
    p.add_argument("--steps", type=int, help="about this many training steps (default: cuda 300, cpu 8)")
    p.add_argument("--rows", type=int, help="synthetic rows (default: cuda 400, cpu 40)")
    p.add_argument("--lr", type=float, help="learning rate (default: cuda speculators' own, cpu 1e-2)")
    p.add_argument("--min-drop", type=float, default=0.1, help="the loss must fall by this fraction (default 0.1)")
    p.add_argument("--work", help="work folder (default: a new temporary one, removed after)")
    p.add_argument("--out", help="where the logs and result.json go (default: WORK/out)")
    p.add_argument("--keep", action="store_true", help="keep the workspace (verifier, data, checkpoints)")
    p.add_argument(
        "--train-timeout",
        type=float,
        default=1800,
        help="seconds before the train stage is stopped (exit 6, with the figures so far)",
    )
    a = p.parse_args(argv)
    if a.prepare:
        return prepare_wheels(Path(a.wheels or REPO / ".whl"), a.also)
    return check(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
