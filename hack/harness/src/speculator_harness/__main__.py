"""`python -m speculator_harness up|down|status|images` (what `hack/dev-cluster` runs).

`up` prints shell `export` lines on stdout (so `eval "$(hack/dev-cluster up)"` works) and its
progress on stderr; the processes keep running until `down`. `images` pushes what hack/build-images
built to the registry of the machine's real node, whichever cluster runs it, and drops the references a
rebuild replaced from the node (the kubelet pulls the new builds).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from speculator_harness import images, node, registry
from speculator_harness.cluster import (
    CACHE,
    ComponentError,
    LocalCluster,
    load_state,
    running_components,
    scrape_networks,
    stop_recorded,
)
from speculator_operator.domain.releases import DIGESTS_ENV


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dev-cluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status", "images"])
    parser.add_argument("--dir", type=Path, help="folder for state, PKI, data and logs (not for images)")
    parser.add_argument("--bin-dir", type=Path, help="folder with the built binaries (hack/build-kube)")
    parser.add_argument("--gpu-nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--no-s3", action="store_true", help="do not start the S3 server")
    parser.add_argument(
        "--real-node",
        choices=["auto", "yes", "no"],
        default="auto",
        help="one real node (auto: where this machine can run it, saying why not otherwise)",
    )
    parser.add_argument("--if-running", action="store_true", help="images: do nothing when no real node runs")
    args = parser.parse_args(argv)
    if args.command == "images":
        return _images(args.if_running)
    if args.dir is None:
        parser.error("--dir is required")
    workdir: Path = args.dir.resolve()

    if args.command == "down":
        stopped = stop_recorded(workdir)
        print(
            f"dev-cluster: stopped {', '.join(stopped)}" if stopped else "dev-cluster: nothing was running",
            file=sys.stderr,
        )
        return 0

    state = load_state(workdir)
    running = running_components(workdir)
    if state is not None and len(running) < len(state.get("pids", {})):
        # a previous `up` whose processes died (or a reboot): clean up what is left and start over
        gone = sorted(set(state.get("pids", {})) - set(running))
        print(f"dev-cluster: recorded cluster is broken ({', '.join(gone)} not running); stopping it", file=sys.stderr)
        stop_recorded(workdir)
        state = None
    if args.command == "status":
        if state is None:
            print("dev-cluster: not running", file=sys.stderr)
            return 1
        print(f"dev-cluster: running: {', '.join(f'{n} (pid {p})' for n, p in running.items())}", file=sys.stderr)
        _print_exports(state)
        return 0

    if state is not None:
        print("dev-cluster: already up (hack/dev-cluster down stops it)", file=sys.stderr)
        _print_exports(state)
        return 0
    if args.bin_dir is None:
        parser.error("--bin-dir is required for up")
    wanted = {"auto": None, "yes": True, "no": False}[args.real_node]
    cluster = LocalCluster(
        workdir,
        args.bin_dir,
        gpu_nodes=args.gpu_nodes,
        gpus_per_node=args.gpus_per_node,
        with_s3=not args.no_s3,
        real_node=wanted,
        timeout=300,
    )
    t0 = time.monotonic()
    try:
        info = cluster.start()
    except ComponentError as exc:
        print(f"dev-cluster: FAILED: {exc}", file=sys.stderr)
        return 1
    print(
        f"dev-cluster: whole stack Ready in {time.monotonic() - t0:.1f} s (logs in {workdir / 'logs'})", file=sys.stderr
    )
    state = load_state(workdir)
    assert state is not None
    _print_exports(state)
    del info
    return 0


def _images(if_running: bool) -> int:
    holder = node.lock_holder()
    workdir = Path(holder) if holder else None
    st = load_state(workdir) if workdir is not None else None
    address = ((st or {}).get("node_record") or {}).get("registry")
    if workdir is None or not (st or {}).get("node") or not address:
        print("dev-cluster: no real node runs: nothing to push to", file=sys.stderr)
        return 0 if if_running else 1

    def say(message: str) -> None:
        print(message, file=sys.stderr)

    pushed = registry.push_built(address, CACHE, say)
    images.forget_replaced(workdir, CACHE, registry.pinned(CACHE), say)
    print(f"dev-cluster: {len(pushed)} image(s) pushed to the real node's registry", file=sys.stderr)
    if pushed:
        print("dev-cluster: an operator started before this push renders the old digests: restart it", file=sys.stderr)
    return 0


def _print_exports(state: dict[str, object]) -> None:
    print(f"export KUBECONFIG={shlex.quote(str(state['kubeconfig']))}")
    s3 = state.get("s3")
    if isinstance(s3, dict):
        print(f"export AWS_ENDPOINT_URL={shlex.quote(s3['endpoint'])}")
        print(f"export AWS_ACCESS_KEY_ID={shlex.quote(s3['access_key'])}")
        print(f"export AWS_SECRET_ACCESS_KEY={shlex.quote(s3['secret_key'])}")
        print(f"export AWS_DEFAULT_REGION={shlex.quote(s3['region'])}")
    digests = state.get("image_digests")
    if isinstance(digests, dict) and digests:
        print(f"export {DIGESTS_ENV}={shlex.quote(json.dumps(digests, sort_keys=True))}")
    node = state.get("node")
    print(f"export SPECULATOR_SCRAPE_NETWORKS={shlex.quote(scrape_networks(node if isinstance(node, str) else None))}")
    print(f'export PATH={shlex.quote(str(state["bin_dir"]))}:"$PATH"')


if __name__ == "__main__":
    sys.exit(main())
