"""Loaded by every Python process hack/gpu-check starts for the trainer stage (it puts this folder first on
PYTHONPATH; nothing else does). It changes nothing unless told by one of two variables:

SPECULATOR_GPU_CHECK_MEMORY=FILE: at exit, a process that used torch writes its peak memory to FILE.<pid>.json
  (CUDA: torch.cuda.max_memory_allocated/reserved; always: the peak resident set). Observation only.

SPECULATOR_GPU_CHECK_CPU=1 (hack/gpu-check --device cpu only): lets speculators 0.9.0's trainer run on a machine
  without an accelerator, which it cannot by itself (its Trainer moves the model and every batch to the local
  rank's device ordinal, `.to(0)`, which is CUDA; under torchrun it sets up the process group of the accelerator
  and raises "No accelerator found" without one; its step timer calls torch.accelerator.synchronize, which
  raises without a driver; it autocasts on the build's accelerator type, "cuda", which torch turns off on a
  machine without CUDA). So, in that mode only:
  - torchrun's LOCAL_RANK is dropped from the environment, and speculators takes its single-process path
    (what `speculators train` without torchrun does);
  - speculators.train.trainer's get_local_rank answers the CPU device, and the Trainer autocasts on "cpu";
  - torch.accelerator.synchronize is a no-op where no accelerator is available.
  On CUDA (the check that matters) none of this is installed: the trainer stage runs as the pod runs it.
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import resource
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def _write_memory(prefix: str) -> None:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out: dict[str, Any] = {"pid": os.getpid(), "argv": sys.argv[:3], "max_rss_mib": round(rss_kib / 1024, 1)}
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda_max_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
            out["cuda_max_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    except Exception as exc:  # a report only
        out["cuda_error"] = str(exc)
    try:
        with open(f"{prefix}.{os.getpid()}.json", "w") as fh:
            json.dump(out, fh)
    except OSError:
        pass


def _patch_trainer(module: ModuleType) -> None:
    import torch

    module.get_local_rank = lambda: torch.device("cpu")  # type: ignore[attr-defined]
    trainer = module.Trainer
    original = trainer.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer.__init__ = __init__


def _wrap(loader: Any, patch: Callable[[ModuleType], None]) -> None:
    run = loader.exec_module

    def exec_module(module: ModuleType) -> None:
        run(module)
        patch(module)

    loader.exec_module = exec_module


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after a module has executed, before anything imports names from it."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        patch = self.patches.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                _wrap(spec.loader, patch)
                return spec
        return None


def _cpu_mode() -> None:
    os.environ.pop("LOCAL_RANK", None)
    sys.meta_path.insert(0, _AfterImport({"speculators.train.trainer": _patch_trainer}))

    def _patch_torch(module: ModuleType) -> None:
        accel = module.accelerator
        synchronize = accel.synchronize

        def quiet(*args: Any, **kwargs: Any) -> None:
            if accel.is_available():
                synchronize(*args, **kwargs)

        accel.synchronize = quiet

    sys.meta_path.insert(0, _AfterImport({"torch": _patch_torch}))


if os.environ.get("SPECULATOR_GPU_CHECK_MEMORY"):
    atexit.register(_write_memory, os.environ["SPECULATOR_GPU_CHECK_MEMORY"])
if os.environ.get("SPECULATOR_GPU_CHECK_CPU") == "1":
    _cpu_mode()
