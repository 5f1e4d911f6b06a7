"""The operator process's entry (`speculator-operator run`): read the settings (runtime/settings.py), set up the
process, check the identity's permissions, and run kopf's controllers, alone or behind a leader election. The
controllers are handed in (`start`, from the CLI): the process's entry imports nothing above runtime/. Exit codes
beyond the CLI's: 3 the Lease was lost (restart as a standby), 4 the identity lacks a verb it needs, 5 another
release's operator watches the same objects (runtime/peers.py)."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speculator_operator.runtime.settings import Settings

EXIT_NOT_ALLOWED = 4  # the operator's identity lacks a verb it needs
EXIT_LEASE_LOST = 3  # another replica holds the Lease now: restart as a standby


def _lease_namespace(args: argparse.Namespace) -> str:
    if args.lease_namespace:
        return str(args.lease_namespace)
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    from pathlib import Path

    sa = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return sa.read_text().strip() if sa.exists() else "default"


def _overlapping(elector: Any, lease_namespace: str, scope: str) -> str | None:
    """The refusal, when another release's live operator watches the same objects and keeps them
    (runtime/peers.py); None when none does. Asked before the election (so that a refused replica never answers
    its readiness probe) and again by the new holder, before its controllers start (two releases started at
    once)."""
    from datetime import UTC, datetime

    from speculator_operator.runtime import kube, peers

    now = datetime.now(UTC)
    own = elector.lease()
    if own is not None:
        me = peers.peer_of(own)
        me = peers.Peer(me.namespace, me.name, peers.parse_scope(scope), me.created, me.holder, me.renewed, 15)
    else:  # the first replica of a new release: the youngest Lease
        me = peers.Peer(lease_namespace, elector.name, peers.parse_scope(scope), now, "", None, 15)
    found = peers.conflicts(me, peers.visible(kube.api(), me.scope, lease_namespace), now)
    return peers.refusal(me, found) if found else None


def run_operator(args: argparse.Namespace, start: Callable[[Settings], None]) -> int:
    """`speculator-operator run`: the settings, read once, then the process's memory settings, then the
    permission check, then kopf (directly, or as the holder of the Lease with --leader-elect) running the
    controllers that `start(settings)` imports and hands the settings to (which registers their handlers)."""
    import logging
    import threading
    import uuid

    from speculator_operator.runtime import allocator, profiling
    from speculator_operator.runtime import settings as operator_settings

    try:  # a malformed setting stops the start here, named; nothing reads the environment for them again
        settings = operator_settings.Settings.from_env(os.environ)
    except operator_settings.SettingsError as exc:
        print(f"speculator-operator: {exc}", file=sys.stderr)
        return 2
    allocator.limit_arenas()  # before any thread starts
    allocator.keep_trimmed(settings.trim_seconds)
    # SPECULATOR_PROFILE: trace allocations from here on, imports included (a profile run)
    profiling.install(settings.profile, settings.profile_mode)

    import kopf

    from speculator_operator.runtime import kube, leader, metrics, peers, permissions

    start(settings)

    kopf_settings = kopf.OperatorSettings()
    # named namespaces: no cluster-wide scanning (kopf would list namespaces and watch CRDs, which a
    # Role-only install may not); the CRDs exist before the operator starts (the chart installs them first)
    kopf_settings.scanning.disabled = bool(args.namespace)
    scope: dict[str, Any] = {
        "standalone": args.standalone or args.leader_elect,  # the Lease elects; kopf's peering would only pause
        "namespaces": args.namespace or (),
        "clusterwide": not args.namespace,
        "liveness_endpoint": args.liveness,
        "settings": kopf_settings,
    }

    kopf.configure(log_prefix=True)  # kopf's log format at INFO, each object's lines prefixed with its name
    if not args.verbose:
        # a line per handler and timer run: at a thousand resources, the log would be mostly these
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    else:
        logging.getLogger("speculator_operator").setLevel(logging.DEBUG)  # each status write and its cause
    lease_namespace = _lease_namespace(args) if args.leader_elect else None
    if not args.skip_permission_check:
        kube.load_config()
        denied = permissions.missing(kube.api(), permissions.checks(args.namespace or [], lease_namespace))
        if denied:
            print(permissions.refusal(denied), file=sys.stderr)
            return EXIT_NOT_ALLOWED
    if lease_namespace is None:
        kopf.run(**scope)
        return 0

    kube.load_config()
    metrics.serve(settings.metrics_port, settings.metrics_address)  # a standby answers its scrape too (leader 0)
    metrics.LEADER.set(0)
    identity = args.identity or f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:6]}"
    watched = peers.scope_text(args.namespace or [])
    elector = leader.Elector(kube.api(), lease_namespace, args.lease_name, identity, scope=watched)
    refused = _overlapping(elector, lease_namespace, watched)
    if refused:
        print(refused, file=sys.stderr)
        return peers.EXIT_OVERLAP
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    health = leader.StandbyHealth(args.liveness)
    try:
        if not elector.acquire(stop):
            return 0  # stopped while a standby
    finally:
        health.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    refused = _overlapping(elector, lease_namespace, watched)
    if refused:
        print(refused, file=sys.stderr)
        elector.release()  # a standby of this release may take it, and is refused alike
        return peers.EXIT_OVERLAP
    lost = threading.Event()
    done = threading.Event()

    def on_lost() -> None:
        # kopf's own SIGTERM path: a graceful stop. (A stop flag would be awaited by a task, or a worker
        # thread, that holds the exit up for as long as nobody sets it.)
        lost.set()
        os.kill(os.getpid(), signal.SIGTERM)

    elector.keep(on_lost, done)
    try:
        kopf.run(**scope)
    finally:
        done.set()
        if not lost.is_set():
            elector.release()
    if lost.is_set():
        print(f"speculator-operator: Lease {lease_namespace}/{args.lease_name} lost; exiting", file=sys.stderr)
        return EXIT_LEASE_LOST
    return 0
