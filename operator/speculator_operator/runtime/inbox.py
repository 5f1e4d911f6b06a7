"""A controller's inbox: what arrives for an object between its passes, kept per key until the pass takes it.

The watches' handlers and the periodic jobs put on kopf's event loop; a pass takes on a work queue's thread
(runtime/controller.py). Every read-modify-write of one key (`put`, `update`, `take`) is made under one lock, so
that nothing put is lost to a take that runs at the same moment. The inbox's size is reported by
`metrics.tracked` under its table's name: every entry is dropped when its object is deleted (`forget`), so after
a burst of creates and deletes each inbox is empty again (tests/cluster/test_burst.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from speculator_operator.runtime import metrics

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Inbox(Generic[K, V]):
    """A keyed mailbox with one lock; `table` names it on the operator's /metrics."""

    def __init__(self, table: str) -> None:
        self.table = table
        self._items: dict[K, V] = {}
        self._lock = threading.Lock()
        metrics.tracked(table, self.__len__)

    def put(self, key: K, value: V) -> None:
        """Hold `value` for `key`, in place of what was held."""
        with self._lock:
            self._items[key] = value

    def update(self, key: K, change: Callable[[V | None], V | None]) -> V | None:
        """Hold `change(what is held now, or None)` for `key` (None: hold nothing), as one step: a take meanwhile
        waits for it. `change` runs under the lock: it must be quick and must not touch this inbox."""
        with self._lock:
            value = change(self._items.get(key))
            if value is None:
                self._items.pop(key, None)
            else:
                self._items[key] = value
            return value

    def update_all(self, change: Callable[[K, V], V | None]) -> None:
        """`update` for every key held (None: that key holds nothing now)."""
        with self._lock:
            for key, value in list(self._items.items()):
                new = change(key, value)
                if new is None:
                    del self._items[key]
                else:
                    self._items[key] = new

    def get(self, key: K) -> V | None:
        """What is held for `key`, left held (None: nothing)."""
        with self._lock:
            return self._items.get(key)

    def take(self, key: K) -> V | None:
        """What is held for `key`, no longer held (None: nothing)."""
        with self._lock:
            return self._items.pop(key, None)

    def forget(self, key: K) -> None:
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)
