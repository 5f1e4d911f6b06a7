"""One kind's control loop: kopf's watches and the periodic jobs only enqueue `(namespace, name)` with a cause;
a work queue (runtime/workqueue.py) runs one pass per object at a time; a pass reads what it needs, plans,
applies the children and writes the status at most once (`PassStatus`).

Why it is built so: before, status was written from fourteen places and children applied from five (the
reconcile, the child events, the input poll, the drift restore, the tuning rollout), each from its own copy
of the object; two of them could apply children at once from copies of different ages, so that "a
mismatched pair is never served" held by timing. With one pass per key, everything that moves an object goes
through the one place that reads it fresh, and a trigger that arrives meanwhile costs exactly one more pass.

What the earlier design won is kept: no finalizer and no kopf bookkeeping (the watches' handlers are plain
event handlers, kopf writes nothing for them), an unchanged world writes nothing (the pass's single write is a
patch of what changed, `runtime/kube.patch_status`), and the pool sizes measured at 1,000 objects
(`runtime/kube.py`). Passes run in threads: they block on the API server, S3 and the Hub, not on the CPU.
They post their Events through the recorder the controller was started with (runtime/events.py), and log with
their pass's id (runtime/workqueue.py).

A pass that fails for good (a status its model refuses, a model it builds that does not validate: a bug of the
operator's, which a retry only repeats) is not retried: the object says so, `Ready=False` and `Stalled=True`
with the reason `TerminalError` and a Warning event of that reason, both naming the error; its next change
runs a pass as usual.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Generic

from pydantic import ValidationError

from speculator_operator.api.common import S, make_condition, merge_status, read_status, status_problems, stored
from speculator_operator.runtime import kube, metrics
from speculator_operator.runtime.events import Discarding, EventRecorder
from speculator_operator.runtime.kube import unreachable
from speculator_operator.runtime.schedule import Generations
from speculator_operator.runtime.workqueue import Result, Terminal, WorkQueue, log_pass_ids

Key = tuple[str, str]  # (namespace, name)
Pass = Callable[[Key, frozenset[str]], Result]
ApplyHook = Callable[[str, str], None]  # (namespace, name)
log = logging.getLogger(__name__)
TERMINAL_ERROR = "TerminalError"  # the reason of the conditions and the event of a pass that failed for good
PLURALS = {kind: plural for plural, kind in kube.KINDS.items()}


class Controller:
    """The work queue of one kind. `run(key, causes)` is the pass; it returns a `Result`."""

    def __init__(
        self,
        kind: str,
        workers: int,
        quick: frozenset[str] = frozenset(),
        quick_workers: int = 0,
        base_delay: float = 1.0,
        max_delay: float = 300.0,
        on_apply: ApplyHook | None = None,
    ) -> None:
        """`quick`: the causes whose passes are cheap (no audit, no checkpoint read); a key with only those is
        taken first, and `quick_workers` more workers take only such keys (runtime/workqueue.py). `on_apply`:
        see `applying`."""
        self.kind, self.workers, self.quick, self.quick_workers = kind, workers, quick, quick_workers
        self.on_apply = on_apply
        self._run: Pass | None = None
        self._base, self._max = base_delay, max_delay
        self.queue: WorkQueue[Key] | None = None
        self.generations = Generations()  # the generation each object's last pass read (runtime/scheduler.py)
        self.recorder: EventRecorder = Discarding()  # until started: a pass run outside the operator posts nothing
        metrics.tracked(f"{kind}.queue", lambda: self.queue.depth() if self.queue is not None else 0)

    def handles(self, run: Pass) -> Pass:
        """Decorates the kind's pass (its controller module registers it)."""
        self._run = run
        return run

    def applying(self, namespace: str, name: str) -> None:
        """Called by a pass of this kind just before it applies the object's children, after it read the object
        and planned them: the extension point `on_apply(namespace, name)` runs there, in the pass's worker
        thread, and the apply waits for it to return (an exception it raises fails the pass like an apply's).

        What it is for: the one moment between a pass's read and its writes, where an observer can see or hold
        a pass. The cluster tests use it to force what timing alone rarely lines up: a trigger of the same
        object that lands while its pass applies (tests/cluster/test_one_pass.py), a hand edit made just before
        a restoration's apply (test_drift.py), every worker held by slow passes (test_slow_work.py). Unset
        (None) in the operator: a pass then costs nothing more. Set it on the kind's Controller
        (controllers/queues.py `DEPLOYMENTS`, `TRAINJOBS`), or pass it when making one."""
        if self.on_apply is not None:
            self.on_apply(namespace, name)

    def start(self, recorder: EventRecorder | None = None) -> None:
        """A fresh queue (an operator restarted in the same process starts from nothing); its passes post their
        events through `recorder`, and every log line of a pass carries the pass's id."""
        self.stop()
        log_pass_ids()
        if recorder is not None:
            self.recorder = recorder
        slow, quick = metrics.LANE_WAIT.labels(f"queue-{self.kind}"), metrics.LANE_WAIT.labels(f"quick-{self.kind}")
        self.queue = WorkQueue(
            self._pass,
            workers=self.workers,
            base_delay=self._base,
            max_delay=self._max,
            name=f"pass-{self.kind}",
            waited=lambda seconds, fast: (quick if fast else slow).observe(seconds),
            quick=(lambda causes: bool(causes) and causes <= self.quick) if self.quick else None,
            quick_workers=self.quick_workers,
            terminal=self.terminal,
            label=lambda key: f"{self.kind}/{key[0]}/{key[1]}",
        )

    def stop(self) -> None:
        if self.queue is not None:
            self.queue.shutdown(timeout=5.0)
            self.queue = None

    def enqueue(self, namespace: str, name: str, cause: str, priority: int = 0) -> None:
        """A pass of the object for `cause`; one of a higher `priority` is taken first in its lane."""
        if self.queue is not None:
            self.queue.add((namespace, name), cause, priority)

    def enqueue_after(self, namespace: str, name: str, cause: str, delay: float) -> None:
        if self.queue is not None:
            self.queue.add_after((namespace, name), cause, delay)

    def forget(self, namespace: str, name: str) -> None:
        if self.queue is not None:
            self.queue.forget((namespace, name))

    def terminal(self, key: Key, error: Terminal) -> None:
        """Say on the object that its pass failed for good (runs on the pass's worker, as the pass's last step):
        Ready=False and Stalled=True (kstatus: Failed) with the reason TerminalError, Reconciling removed, for the
        generation stored now; and a Warning event, posted once: while the same error repeats (a resync's pass
        meets it again), the status is already so and nothing is written or posted."""
        namespace, name = key
        plural = PLURALS[self.kind]
        raw = kube.read_custom(plural, namespace, name)
        if raw is None or raw["metadata"].get("deletionTimestamp"):
            return
        generation = int(raw["metadata"].get("generation") or 0)
        message = f"the operator failed on this object and does not retry until it changes: {error}"
        old = dict(raw.get("status") or {})
        new = merge_status(
            old,
            generation,
            make_condition(generation, "Ready", False, TERMINAL_ERROR, message),
            make_condition(generation, "Stalled", True, TERMINAL_ERROR, message),
            now=datetime.now(UTC),  # the shell reads the clock; this write is its own, not a planner's
        )
        new["conditions"] = [c for c in new["conditions"] if c.get("type") != "Reconciling"]
        if not kube.status_patch(old, new):
            return
        kube.patch_status(plural, namespace, name, old, new, "terminal")
        self.recorder.event(raw, type="Warning", reason=TERMINAL_ERROR, message=message)

    def _pass(self, key: Key, causes: frozenset[str]) -> Result:
        outcome = "ok"
        assert self._run is not None, f"no pass registered for {self.kind}"
        start = time.perf_counter()
        try:
            result = self._run(key, causes)
            if result.retry:
                outcome = "retry"
            return result
        except Terminal as exc:
            outcome = "error"
            log.error("%s/%s: pass failed for good, not retried (%s)", *key, exc, exc_info=exc.error)
            raise
        except (StatusRefused, ValidationError) as exc:  # the operator's own bug: a retry meets it again
            outcome = "error"
            log.error("%s/%s: pass failed for good, not retried (%s: %s)", *key, type(exc).__name__, exc, exc_info=exc)
            raise Terminal(exc) from exc
        except Exception as exc:
            outcome = "error"
            why = unreachable(exc)
            if why is not None:
                log.warning("%s/%s: the API server did not answer (%s); again soon", *key, why)
            else:
                log.exception("%s/%s: pass failed (%s: %s)", *key, type(exc).__name__, exc)
            return Result(retry=True)
        finally:
            metrics.PASSES.labels(self.kind, outcome).inc()
            lane = "quick" if causes and causes <= self.quick else "slow"
            metrics.PASS_SECONDS.labels(self.kind, lane).observe(time.perf_counter() - start)


class StatusRefused(Exception):
    """A pass computed a status its model does not take: a bug of the operator's, said rather than written (the
    API server would prune an unknown key without a word)."""


class PassStatus(Generic[S]):
    """The status one pass writes, as its typed model: the stored one as read at the start (as the model knows
    it: keys an older operator wrote and this one has no field for are left out, api/common.read_status), the
    steps' changes (each a new model from a planner), and one patch of what changed at the end, labelled by the
    first of the causes in `order` it has. The status about to be written is checked against the model once more
    (api/common.status_problems): a planner's model is validated when built, this guards what is sent. `derive`
    computes what follows from the rest of the status (the kstatus conditions, planning/health.py) just before the
    write, so that every path through a pass ends with them."""

    def __init__(
        self,
        model: type[S],
        plural: str,
        namespace: str,
        name: str,
        raw: dict[str, Any],
        derive: Callable[[S], S] | None = None,
    ) -> None:
        self.model, self.plural, self.namespace, self.name = model, plural, namespace, name
        self.derive = derive
        self.stored = read_status(model, raw)
        self.status: S = model.model_validate(self.stored)
        self.causes: list[str] = []

    def set(self, new: S, cause: str) -> None:
        """The status after one step of the pass; `cause` is recorded if the step changed it."""
        if stored(new) != stored(self.status) and cause not in self.causes:
            self.causes.append(cause)
        self.status = new

    def write(self, order: Iterable[str] = ()) -> bool:
        """Write what changed since the pass read the object (nothing when nothing did); True if it wrote."""
        if self.derive is not None:
            self.status = self.derive(self.status)
        status = stored(self.status)
        if not kube.status_patch(self.stored, status):
            return False
        problems = status_problems(self.model, status)
        if problems:
            raise StatusRefused(f"{self.model.__name__} of {self.namespace}/{self.name}: {'; '.join(problems)}")
        cause = next((c for c in order if c in self.causes), self.causes[0] if self.causes else "reconcile")
        kube.patch_status(self.plural, self.namespace, self.name, self.stored, status, cause)
        self.stored = status
        return True
