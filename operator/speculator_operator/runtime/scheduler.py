"""The operator's own scheduling, in place of kopf's per-object handlers with state (create/update/resume and
timers): objects go to their kind's work queue (runtime/controller.py), and one loop runs all periodic work.

Why: kopf keeps a handler's state in the object itself. Its create/update handlers write a diff-base
annotation after each change and progress annotations around every retry; a timer or a daemon makes it
put a finalizer on every object (two more writes, and a `kubectl delete` that hangs while no operator
runs). At 1,000 resources that was three writes per resource of bookkeeping, and a timer is an asyncio
task per object and kind. Here:

- an event handler (kopf writes nothing for those) enqueues an object the first time the operator sees it
  and whenever its `.metadata.generation` moves past the one its last pass read (rules:
  runtime/schedule.py); retries and back-off are the work queue's;
- one loop, started with the first event, runs the periodic jobs (`every`) of every object it has seen, at
  most one run per object and job at a time. The jobs decide in the loop whether anything is due, do slow
  reads (a log, a scrape, a revision) in a lane of their own, hold what they observed in memory, and enqueue
  the object: only its pass writes.
  Bodies are kept without managedFields (what the jobs read, nothing more), as compact JSON decoded for each
  job run (`_Seen`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf

from speculator_operator.api.common import GROUP, VERSION
from speculator_operator.planning.passes import Cause
from speculator_operator.runtime import metrics
from speculator_operator.runtime.controller import Controller
from speculator_operator.runtime.events import EventRecorder
from speculator_operator.runtime.kube import PERIODIC_WORKERS, unreachable, waited
from speculator_operator.runtime.schedule import Every, Generations

TICK_SECONDS = 1.0
PERIODIC_LANE = ThreadPoolExecutor(max_workers=PERIODIC_WORKERS, thread_name_prefix="periodic")
log = logging.getLogger(__name__)

Job = Callable[[kopf.Body], Awaitable[None]]


@dataclass
class _Periodic:
    plural: str
    name: str
    every: Every
    fn: Job


@dataclass
class _Seen:
    """An object as its latest event showed it, kept as compact JSON and decoded for each job that runs: the
    decoded tree of a SpeculatorDeployment with its status is some hundreds of small Python objects, and at
    1,000 objects those trees were the largest thing the operator held (docs/performance/README.md)."""

    kept: bytes
    changed_at: float

    @property
    def body(self) -> kopf.Body:
        return kopf.Body(json.loads(self.kept))


_jobs: list[_Periodic] = []
_controllers: dict[str, Controller] = {}
_generations: dict[str, Generations] = {}
_gone: dict[str, list[Callable[[str, str, str], None]]] = {}
_objects: dict[str, dict[str, _Seen]] = {}
_running: set[tuple[str, str]] = set()
_tasks: set[asyncio.Task[None]] = set()
_task: asyncio.Task[None] | None = None
_recorder: EventRecorder | None = None  # the operator's events, from start-up to clean-up (runtime/events.py)
metrics.tracked("periodic.objects", lambda: sum(len(seen) for seen in list(_objects.values())))
metrics.tracked(
    "periodic.generations", lambda: sum(len(g.handled) + len(g.failed) for g in list(_generations.values()))
)
metrics.tracked("periodic.schedules", lambda: sum(len(job.every.next_at) for job in _jobs))


def every(plural: str, *, interval: float, initial: float | None = None, idle: float = 0.0) -> Callable[[Job], Job]:
    """Run the decorated `async fn(body)` for every object of `plural` (kopf's timer semantics)."""

    def register(fn: Job) -> Job:
        _track(plural)
        _jobs.append(_Periodic(plural, fn.__name__, Every(interval, initial, idle), fn))
        return fn

    return register


def controlled(plural: str, controller: Controller) -> None:
    """Objects of `plural` go to `controller`'s work queue: the first time the operator sees each (as kopf's
    resume did) and whenever its `.metadata.generation` moves past the one its last pass read, with the cause
    "spec"; its retries and back-off are the queue's. An event that brings nothing new (most are the operator's
    own status writes) is told apart here, in the event loop, without a thread."""
    _track(plural)
    _controllers[plural] = controller
    _generations[plural] = controller.generations

    @kopf.on.event(GROUP, VERSION, plural)
    async def _enqueue(*, body: kopf.Body, type: str | None, **_: Any) -> None:
        meta = body.get("metadata") or {}
        uid, generation = str(meta.get("uid") or ""), int(meta.get("generation") or 0)
        if type == "DELETED" or not uid or meta.get("deletionTimestamp"):
            return
        if controller.generations.wants(uid, generation, time.monotonic()):
            controller.enqueue(str(meta.get("namespace") or ""), str(meta.get("name") or ""), Cause.SPEC)


def on_gone(plural: str) -> Callable[[Callable[[str, str, str], None]], Callable[[str, str, str], None]]:
    """The decorated `fn(namespace, name, uid)` runs when an object of `plural` is deleted."""

    def register(fn: Callable[[str, str, str], None]) -> Callable[[str, str, str], None]:
        _track(plural)
        _gone.setdefault(plural, []).append(fn)
        return fn

    return register


def _track(plural: str) -> None:
    if plural in _objects:
        return
    _objects[plural] = {}

    @kopf.on.event(GROUP, VERSION, plural)
    async def _seen(*, body: kopf.Body, type: str | None, **_: Any) -> None:
        seen(plural, body, type)
        _start()


def _kept(body: Mapping[str, Any]) -> bytes:
    meta = body.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "uid", "generation", "labels", "deletionTimestamp") if k in meta}
    raw = {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": kept}
    for key in ("spec", "status"):
        if key in body:
            raw[key] = dict(body[key] or {})
    return json.dumps(raw, separators=(",", ":")).encode()


def seen(plural: str, body: Mapping[str, Any], type: str | None) -> None:
    meta = body.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if not uid:
        return
    if type == "DELETED":
        _objects[plural].pop(uid, None)
        for job in _jobs:
            job.every.forget(uid)
        if plural in _generations:
            _generations[plural].forget(uid)
        if plural in _controllers:
            _controllers[plural].forget(str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        for fn in _gone.get(plural, []):
            try:
                fn(str(meta.get("namespace") or ""), str(meta.get("name") or ""), uid)
            except Exception:
                log.exception("forgetting %s/%s failed", meta.get("namespace"), meta.get("name"))
        return
    _objects[plural][uid] = _Seen(_kept(body), time.monotonic())


def tracking(plural: str, uid: str) -> bool:
    """Whether `uid` is still live here: False once its DELETED event ran the on_gone callbacks. A job
    launched before that event may still run; it checks this before it keeps anything by the object, since
    the callbacks will not run again for it."""
    return uid in _objects.get(plural, {})


def latest(plural: str, uid: str) -> kopf.Body | None:
    found = _objects.get(plural, {}).get(uid)
    return found.body if found else None


async def in_lane(fn: Callable[..., Any], *args: Any) -> Any:
    """Run `fn(*args)` in the periodic pool."""
    return await asyncio.get_running_loop().run_in_executor(PERIODIC_LANE, waited("periodic", fn), *args)


def _start() -> None:
    global _task
    if _task is None or _task.done():
        _task = asyncio.get_running_loop().create_task(_loop(), name="speculator-operator periodic")


@kopf.on.startup()
def reset(settings: kopf.OperatorSettings, **_: Any) -> None:
    """A fresh start: every object is reconciled again when seen, as kopf's resume did (an operator
    restarted in the same process, as the tests do, starts from nothing as well). The controllers are handed
    the recorder their passes post their events through."""
    global _task, _recorder
    _task = None
    for objects in _objects.values():
        objects.clear()
    for generations in _generations.values():
        generations.handled.clear()
        generations.failed.clear()
    for job in _jobs:
        job.every.next_at.clear()
    _running.clear()
    if _recorder is not None:
        _recorder.close()
    _recorder = EventRecorder()
    for controller in _controllers.values():
        controller.start(_recorder)


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    for controller in _controllers.values():
        await asyncio.to_thread(controller.stop)
    if _recorder is not None:
        await asyncio.to_thread(_recorder.close)  # what the last passes said is posted first
    if _task is not None:
        _task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await _task


async def _run(key: tuple[str, str], what: str, work: Awaitable[None]) -> None:
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        why = unreachable(exc)
        if why is not None:
            log.warning("%s of %s: the API server did not answer (%s)", key[0], what, why)
        else:
            log.exception("%s of %s failed", key[0], what)
    finally:
        _running.discard(key)


def _launch(key: tuple[str, str], body: kopf.Body, work: Awaitable[None]) -> None:
    _running.add(key)
    what = f"{body.get('metadata', {}).get('namespace')}/{body.get('metadata', {}).get('name')}"
    task = asyncio.get_running_loop().create_task(_run(key, what, work))
    _tasks.add(task)  # the loop keeps only a weak reference to a task
    task.add_done_callback(_tasks.discard)


async def while_tracked(plural: str, uid: str, fn: Job, body: kopf.Body) -> None:
    """Run a job launched for `uid` only if the object is still tracked when the task starts: its DELETED
    event may be handled in between, and whatever the job kept by it then would never be forgotten."""
    if tracking(plural, uid):
        await fn(body)


async def _loop() -> None:
    while True:
        now = time.monotonic()
        for job in _jobs:
            for uid, found in list(_objects[job.plural].items()):
                key = (job.name, uid)
                if key not in _running and job.every.due(uid, now, found.changed_at):
                    body = found.body
                    _launch(key, body, while_tracked(job.plural, uid, job.fn, body))
        slept = time.monotonic()
        await asyncio.sleep(TICK_SECONDS)
        metrics.LOOP_LAG.observe(max(0.0, time.monotonic() - slept - TICK_SECONDS))
