"""The operator process's memory settings: botocore's models as plain dicts, glibc's arenas capped."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from speculator_operator.adapters.sources import s3_client
from speculator_operator.runtime import allocator


def test_the_s3_client_works_from_models_loaded_as_plain_dicts() -> None:
    creds = {
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:9",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    client = s3_client(creds)
    model = client.meta.service_model
    assert type(model._service_description) is dict
    assert "Range" in model.operation_model("GetObject").input_shape.members
    # the model drives the client: a signed ranged GET is rendered without the network
    url = client.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "m/config.json"})
    assert url.startswith("http://127.0.0.1:9/b/m/config.json?")
    assert "X-Amz-Signature=" in url or "Signature=" in url


def _limit_arenas_in_a_process_of_its_own(env: dict[str, str]) -> bool:
    """allocator.limit_arenas() in a fresh interpreter: mallopt changes the whole process's allocator, which
    is not the test session's to change."""
    code = (
        "import sys; from speculator_operator.runtime import allocator; sys.exit(0 if allocator.limit_arenas() else 1)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def test_arenas_are_capped_unless_the_environment_says_otherwise() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert _limit_arenas_in_a_process_of_its_own(env) is True  # glibc here
    # glibc read the variable at start: it stands
    assert _limit_arenas_in_a_process_of_its_own({**env, "MALLOC_ARENA_MAX": "4"}) is False


def _resident() -> int:
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmRSS:"))


def test_trimming_hands_freed_heap_pages_back() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # 32 MiB in 64 KiB blocks from the C heap, touched, then freed but for the last: it holds the heap's top, so
    # glibc keeps the rest (it returns memory by itself only from the top)
    blocks = [libc.malloc(64 * 1024) for _ in range(512)]
    for b in blocks:
        ctypes.memset(b, 1, 64 * 1024)
    for b in blocks[:-1]:
        libc.free(b)
    before = _resident()
    assert allocator.trim() is True
    after = _resident()
    libc.free(blocks[-1])
    assert before - after >= 16 * 2**20, f"{(before - after) / 2**20:.1f} MiB handed back"


def test_the_trimming_thread_trims_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    trims = threading.Semaphore(0)
    monkeypatch.setattr(allocator, "trim", lambda: trims.release() or True)
    stop = threading.Event()
    thread = allocator.keep_trimmed(interval=0.01, stop=stop)
    assert thread.daemon
    assert trims.acquire(timeout=10), "no trim ran"
    assert trims.acquire(timeout=10), "it trimmed once, not every interval"
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()


def test_heap_in_use_counts_what_is_handed_out_not_what_is_kept() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = allocator.heap_in_use()
    assert before is not None  # glibc here
    blocks = [libc.malloc(64 * 1024) for _ in range(256)]  # 16 MiB
    held = allocator.heap_in_use()
    for b in blocks:
        libc.free(b)
    after = allocator.heap_in_use()
    assert held is not None
    assert after is not None
    assert held - before >= 16 * 2**20
    assert held - after >= 16 * 2**20  # freed is no longer in use, whether or not it stays resident
