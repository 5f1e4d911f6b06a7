"""Waiting for a condition, for every tier: a check that raises AssertionError until it holds."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 60, interval: float = 0.5) -> T:
    """Retry `check` until it returns without raising AssertionError (its value), or re-raise after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(interval)
