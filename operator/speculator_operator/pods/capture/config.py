"""The capture's settings, read live from the file $SPECULATOR_CAPTURE_CONFIG names (a ConfigMap the operator mounts): a
change reaches the running server without a restart. What is fixed for the pod's life (its pair, its flags, where
shards go) comes with the pod template in $SPECULATOR_CAPTURE_POD and wins over the file (render/capture.py). The
file is looked at (one stat) at most every CHECK_SECONDS, and read again only when its stat changed; the kubelet
swaps a ConfigMap's files by renaming a symlink, which a stat of the path sees.

Fail closed for data, open for serving: a file that is missing, unreadable, not the settings, or a redaction that
does not compile turns the capture off (the server keeps serving, and the flag's metrics are still removed from
responses), counts one error and logs one line that names the reason — never a value from the file, since a redaction
pattern may itself spell what it hides."""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from speculator_operator.api.podcontract import CAPTURE_CONFIG_ENV, CAPTURE_POD_SETTINGS_ENV, CaptureSettings
from speculator_operator.pods.capture import metrics

log = logging.getLogger(__name__)
CHECK_SECONDS = 2.0  # the longest a change of the file takes to apply


@dataclass(frozen=True)
class Active:
    """Settings the capture runs with, their redactions compiled."""

    settings: CaptureSettings
    patterns: tuple[re.Pattern[str], ...]


class LiveSettings:
    """The settings in force now: `current()` is None while the capture is off."""

    def __init__(
        self,
        path: str | None = None,
        *,
        pod: str | None = None,
        check_seconds: float = CHECK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path if path is not None else os.environ.get(CAPTURE_CONFIG_ENV) or None
        self.pod = pod if pod is not None else os.environ.get(CAPTURE_POD_SETTINGS_ENV) or ""
        self.check_seconds = check_seconds
        self.clock = clock
        self._checked: float | None = None
        self._stat: tuple[int, int, int] | None = None
        self._content: bytes | None = None
        self._active: Active | None = None
        self._last_good: CaptureSettings | None = None  # what removes the flag's metrics while the capture is off
        self._why: str | None = "starting"  # the reason logged last (one failure logs one line); None: on
        self._lock = threading.Lock()  # the event loop and the retention thread both read
        try:
            fixed = json.loads(self.pod or "{}")
        except ValueError:
            fixed = {}
        # the user's own metrics flags, from the pod's start: before the ConfigMap's file is there too
        self._fixed_keeps = (bool(fixed.get("keepMetrics")), bool(fixed.get("timingMetrics"))) if isinstance(
            fixed, dict) else (False, False)  # fmt: skip

    @property
    def last_good(self) -> CaptureSettings | None:
        self.current()
        return self._last_good

    def keeps(self) -> tuple[bool, bool]:
        """Whether the user's own --per-request-spec-decode-metrics and --enable-per-request-metrics are set: what
        of a response's metrics reaches the client as it is."""
        last = self.last_good
        return (last.keep_metrics, last.timing_metrics) if last is not None else self._fixed_keeps

    def current(self) -> Active | None:
        with self._lock:
            return self._current()

    def _current(self) -> Active | None:
        now = self.clock()
        if self._checked is not None and now - self._checked < self.check_seconds:
            return self._active
        self._checked = now
        if self.path is None:
            self._off(f"{CAPTURE_CONFIG_ENV} is not set", count=False)
            return None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._stat = self._content = None
            self._off(f"{self.path}: {exc.strerror or type(exc).__name__}")
            return None
        stat = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stat == self._stat:
            return self._active
        self._stat = stat
        try:
            with open(self.path, "rb") as f:
                content = f.read()
        except OSError as exc:
            self._content = None
            self._off(f"{self.path}: {exc.strerror or type(exc).__name__}")
            return None
        if content == self._content:
            return self._active
        self._content = content
        self._load(content)
        return self._active

    def _load(self, content: bytes) -> None:
        try:
            live, fixed = json.loads(content), json.loads(self.pod or "{}")
        except ValueError as exc:  # the position only: the text may be a redaction pattern
            self._off(f"{self.path} or ${CAPTURE_POD_SETTINGS_ENV}: not JSON (at position {getattr(exc, 'pos', '?')})")
            return
        if not isinstance(live, dict) or not isinstance(fixed, dict):
            self._off(f"{self.path} or ${CAPTURE_POD_SETTINGS_ENV}: not a JSON object")
            return
        try:
            settings = CaptureSettings.model_validate({**live, **fixed})
        except ValidationError as exc:
            # the locations and kinds of the errors only: the input values are the file's
            where = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(file)'}: {e['type']}" for e in exc.errors())
            self._off(f"{self.path}: not capture settings ({where})")
            return
        patterns = []
        for i, redaction in enumerate(settings.redact):
            try:
                patterns.append(re.compile(redaction.pattern))
            except re.error as exc:
                self._last_good = settings
                self._off(f"{self.path}: redact[{i}] does not compile ({exc.msg} at position {exc.pos})")
                return
        self._last_good = settings
        if not settings.enabled:
            self._off("capture disabled by the operator", count=False)
            return
        self._active = Active(settings, tuple(patterns))
        if self._why is not None:
            log.info("capture on: %s/%s, fraction %s", settings.namespace, settings.deployment, settings.fraction)
        self._why = None

    def _off(self, why: str, *, count: bool = True) -> None:
        self._active = None
        if why != self._why:
            if count:
                metrics.ERRORS.labels("config").inc()
            log.warning("capture off: %s", why)
        self._why = why
