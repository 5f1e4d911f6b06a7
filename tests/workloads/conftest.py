"""The workloads lane: the real speculators 0.9.0 CLI (and its torch) in their own cached environment."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from speculator_harness import LocalCluster, S3Info
from speculator_operator.domain.algorithms import SERVED_AS_DRAFT
from speculator_operator.domain.qualification import Check, Evidence
from speculator_operator.render.training import WORKSPACE

from ..lanes import REPO, make_tiny_verifier, run_in, workloads_env_path
from .images import EVIDENCE_ENV, IMAGES, UNBUILT_ENV, qualifying

__all__ = ["REPO", "container_argv", "ensure_bucket", "run_in"]
# every algorithm vLLM loads as a draft (the algorithm table): each one a `train --dry-run` from the tiny verifier
ALGORITHMS = tuple(SERVED_AS_DRAFT)
# the vLLM processes started here run as the server image's cpu variant runs them: the model in the engine's
# own process, no worker process beside it (docs/performance/vllm-cpu-startup.md)
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@pytest.fixture(scope="session")
def workloads_env() -> Path:
    return workloads_env_path()


@pytest.fixture(scope="session")
def vllm_env() -> Path:
    env = os.environ.get("SPECULATOR_VLLM_ENV")
    if not env:
        out = subprocess.run([str(REPO / "hack" / "workloads-env"), "vllm"], check=True, capture_output=True,
                             text=True)  # fmt: skip
        env = out.stdout.strip().splitlines()[-1]
    return Path(env)


@pytest.fixture(scope="session")
def dry_run_checkpoints(workloads_env: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Checkpoints written by the real `speculators train --dry-run` from a tiny local verifier."""
    root = tmp_path_factory.mktemp("speculators")
    verifier = root / "verifier"
    make_tiny_verifier(workloads_env, verifier)
    (root / "data").mkdir()
    out = {"verifier": verifier}
    common = [
        "--verifier-name-or-path",
        str(verifier),
        "--data-path",
        str(root / "data"),
        "--log-dir",
        str(root / "logs"),
    ]
    for algo in ALGORITHMS:
        run_in(workloads_env, "speculators", "train", "--dry-run", "--speculator-type", algo,
               "--save-path", str(root / algo), *common)  # fmt: skip
        out[algo] = root / algo
    # a pruned draft vocabulary (t2d/d2t) from vocab maps made here
    run_in(workloads_env, "python", "-c", (
        "import numpy as np; V, Vd = 512, 256; rng = np.random.default_rng(0); "
        "ids = np.sort(rng.choice(V, Vd, replace=False)); t2d = np.zeros(V, bool); t2d[ids] = True; "
        f"np.save('{root}/t2d.npy', t2d); np.save('{root}/d2t.npy', (ids - np.arange(Vd)).astype(np.int64))"
    ))  # fmt: skip
    run_in(workloads_env, "speculators", "train", "--dry-run", "--speculator-type", "eagle3",
           "--save-path", str(root / "eagle3-pruned"), "--draft-vocab-size", "256",
           "--d2t-path", str(root / "d2t.npy"), "--t2d-path", str(root / "t2d.npy"), *common)  # fmt: skip
    out["eagle3-pruned"] = root / "eagle3-pruned"
    return out


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Info]:
    """A real S3 protocol server (the local cluster's, alone)."""
    bins = (
        os.environ.get("SPECULATOR_BIN_DIR")
        or subprocess.run(
            [str(REPO / "hack" / "build-kube"), "--print-bin-dir"], check=True, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    local = LocalCluster(tmp_path_factory.mktemp("s3"), Path(bins))
    info = local.start_s3_only()
    try:
        yield info
    finally:
        local.stop()


def container_argv(child: dict[str, Any], workspace: Path) -> list[str]:
    """A stage Job's container command, with the workspace mount made a local folder."""
    (c,) = child["spec"]["template"]["spec"]["containers"]
    return [a.replace(WORKSPACE, str(workspace)) for a in [*c["command"], *c["args"]]]


def ensure_bucket(s3: S3Info, bucket: str) -> Any:
    """An S3 client, with `bucket` made if it is not there yet (the S3 server is the session's)."""
    s3c = s3.client()
    if bucket not in {b["Name"] for b in s3c.list_buckets().get("Buckets", [])}:
        s3c.create_bucket(Bucket=bucket)
    return s3c


# ------------------------------------------------------------------------- evidence (hack/qualify-release)

CHECKS: list[Check] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With $SPECULATOR_EVIDENCE_OUT set, each test is one check: passed only if it ran and passed (a skip is a check
    that did not run). Its detail: what the test recorded (record_property("detail", ...)), else why it failed or
    was skipped."""
    if not os.environ.get(EVIDENCE_ENV) or "host" in report.keywords:
        return  # a check marked `host` is about this machine (say its CPU's AMX), not about the release
    if report.when != "call" and report.passed:
        return
    name = report.nodeid.removeprefix("tests/workloads/")
    detail = "; ".join(str(v) for k, v in report.user_properties if k == "detail")
    if report.skipped:
        longrepr = report.longrepr
        detail = str(longrepr[-1]) if isinstance(longrepr, tuple) else str(longrepr)
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)  # the exception's own message, the assertion's included
        said = crash.message if crash is not None else (report.longreprtext.strip().splitlines() or ["failed"])[-1]
        detail = f"{report.when}: {said}"[:500]
    CHECKS[:] = [c for c in CHECKS if c.name != name or c.passed]  # a failed teardown replaces the passed call
    CHECKS.append(Check(name=name, passed=report.passed, detail=detail))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get(EVIDENCE_ENV)
    if not out:
        return
    import datetime
    import platform

    # an image hack/qualify-release could not build is a failed check of its own, with the build's reason
    unbuilt = json.loads(os.environ.get(UNBUILT_ENV) or "{}")
    checks = [Check(name=f"build: {role} image", passed=False, detail=why) for role, why in sorted(unbuilt.items())]
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        # interrupted, or a module that did not even collect: the checks recorded are not all of them
        ended = pytest.ExitCode(exitstatus).name
        checks.append(Check(name="session", passed=False, detail=f"pytest ended with {ended}"))
    CHECKS.extend(checks)

    release = qualifying()
    memory = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:")), "0")  # fmt: skip
    served = (f"served on vLLM's CPU build (vllm-cpu {release.vllm}): the checks test_vllm_cpu.py and "
              "test_rendered_serving.py above, and every CI run" if release.served_on_cpu
              else f"not served: no CPU build of vLLM {release.vllm} exists (vllm-cpu stops at 0.32.0), and no "
              "machine here has a GPU")  # fmt: skip
    evidence = Evidence(
        release=release.name,
        recorded=datetime.datetime.now(datetime.UTC).date().isoformat(),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, {int(memory) // 1024**2} GiB",
        command=f"hack/qualify-release {release.name}",
        images=dict(sorted(IMAGES.items())),
        checks=CHECKS,
        served=served,
    )
    Path(out).write_text(evidence.model_dump_json(indent=2) + "\n")


@pytest.fixture(scope="session")
def trainer_image() -> str:
    """The trainer image of the release under check (tests/workloads/images.py), its installed versions noted."""
    from .images import built_image, record_image

    release = qualifying()
    image = built_image(release.reference("trainer"), f"hack/build-images --release {release.name} builds it")
    record_image("trainer", image)
    return image


@pytest.fixture(scope="session")
def release_checkpoints(
    trainer_image: str, workloads_env: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Checkpoints written by `speculators train --dry-run` inside the release's trainer image (its speculators on its
    torch), one per algorithm vLLM loads as a draft, from the tiny verifier; "verifier" is the verifier."""
    from .images import run_image

    root = tmp_path_factory.mktemp("release-checkpoints")
    verifier = make_tiny_verifier(workloads_env, root / "verifier")
    (root / "data").mkdir()
    for path in [root, *root.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o644)  # the image runs as a user of its own
    out: dict[str, Path] = {"verifier": verifier}
    for algo in ALGORITHMS:
        ran = run_image(trainer_image, "train", "--dry-run", "--speculator-type", algo, "--save-path", f"/work/{algo}",
                        "--verifier-name-or-path", "/work/verifier", "--data-path", "/work/data", "--log-dir",
                        f"/work/logs-{algo}", mounts={root: "rw:/work"}, env={"HF_HUB_OFFLINE": "1"},
                        entrypoint="speculators")  # fmt: skip
        assert ran.returncode == 0, f"{algo}: {ran.stderr[-3000:]}"
        out[algo] = root / algo
    return out


@pytest.fixture(scope="session")
def cuda_image() -> str:
    """The CUDA server image of the release under check, its installed versions noted."""
    from .images import built_image, record_image

    how = "hack/test-images builds it and runs this tier (hack/qualify-release another release's)"
    ref = qualifying().reference("server", "cuda")
    unbuilt = json.loads(os.environ.get(UNBUILT_ENV) or "{}")
    if "server" in unbuilt:
        # hack/qualify-release could not build it (its build is a failed check): the check image, where it built,
        # still lets the checks that read vLLM's code and run its parser run; the installed versions then differ
        ref, how = f"{ref}-check", f"neither it nor its check image built here: {unbuilt['server']}"
        record_as = "server-check"
    else:
        record_as = "server"
    built_image(ref, how)
    record_image(record_as, ref)
    return ref
