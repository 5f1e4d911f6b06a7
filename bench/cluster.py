"""The local control plane for a benchmark: started in a temporary folder, the process's kube config pointed at it,
and stopped (with the operator process the bench started) however the bench ends."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import config

from speculator_harness import ClusterInfo, LocalCluster


@contextmanager
def local_cluster(root: Path, bin_dir: Path, gpu_nodes: int = 2) -> Iterator[ClusterInfo]:
    local = LocalCluster(root / "cluster", bin_dir, gpu_nodes=gpu_nodes, log=lambda m: None)
    info = local.start()
    try:
        os.environ.update(info.env())
        config.load_kube_config(config_file=str(info.kubeconfig))
        yield info
    finally:
        local.stop()


def stop(op: subprocess.Popen[bytes] | None) -> None:
    """The operator process, asked to stop, then killed if it does not within 30 s."""
    if op is None or op.poll() is not None:
        return
    op.terminate()
    try:
        op.wait(30)
    except subprocess.TimeoutExpired:
        op.kill()
        op.wait(30)
