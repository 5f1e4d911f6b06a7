"""Children changed by hand. The operator server-side applies its children with force, so after its apply
no other manager owns a field it sets: an entry of another manager in a child's managedFields that owns
spec fields (`kubectl edit`, `kubectl scale`, `kubectl patch`, another controller) means someone changed
it since. Such a child is re-applied; if that changes nothing, the other manager owns only fields the
operator does not set (an extra env var, say): theirs to keep, and `fingerprint` lets the caller
remember that it was looked at. Metadata others add (labels, annotations) and status writers (the
Deployment controller) never count. Timestamps are not compared: they have one-second resolution, and an
edit in the same second as the operator's apply is as common as not."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any


def _foreign(child: Mapping[str, Any], manager: str) -> list[Mapping[str, Any]]:
    entries = (child.get("metadata") or {}).get("managedFields") or []
    return [
        e
        for e in entries
        if e.get("manager") != manager
        and (e.get("subresource") or "") in ("", "scale")
        and "f:spec" in (e.get("fieldsV1") or {})
    ]


def edited_by(child: Mapping[str, Any], manager: str) -> str | None:
    """Another manager that owns spec fields of the child, or None."""
    found = _foreign(child, manager)
    return str(found[0].get("manager") or "someone") if found else None


def _owned(entry: Mapping[str, Any]) -> str:
    return json.dumps([entry.get("manager"), entry.get("subresource"), entry.get("fieldsV1")], sort_keys=True)


def fingerprint(child: Mapping[str, Any], manager: str) -> str:
    """What the other managers own of the child's spec, as a digest."""
    owned = sorted(_owned(e) for e in _foreign(child, manager))
    return hashlib.sha256("\n".join(owned).encode()).hexdigest()[:16]


def taken_from(before: Mapping[str, Any] | None, after: Mapping[str, Any], manager: str) -> list[str]:
    """The other managers that own less (or other) of the child's spec after an apply by `manager` than before
    it: what the apply took back, by whom it had been changed. `before` must be exactly what the apply replaced
    (an apply carrying its resourceVersion): a status write in between is no restoration, and an edit landing
    after the apply is not hidden by it."""
    if before is None:
        return []
    kept = {_owned(e) for e in _foreign(after, manager)}
    return sorted({str(e.get("manager") or "someone") for e in _foreign(before, manager) if _owned(e) not in kept})
