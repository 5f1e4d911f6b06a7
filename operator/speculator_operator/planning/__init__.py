"""Pure planners: observed world -> desired children + typed status, one module per kind (trainjob, deployment),
with the policies beside them: drift, retention, tuning, pod problems and the status side of progress."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from speculator_operator.domain.releases import Release, ReleaseError, get_release

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Problem:
    """Why something cannot go on: a condition reason and its message."""

    reason: str
    message: str


def parse_spec(model: type[M], raw: Mapping[str, Any], resolved: str | None = None) -> tuple[M, Release] | Problem:
    """The typed spec and its pinned release, or why not (InvalidSpec, ReleaseUnsupported). A spec that names no
    release keeps the one it was resolved to before (`resolved`, from its status) while that one is usable, so that
    moving the operator's default rolls nothing that runs: only new objects, and specs that name a release, move
    (docs/concepts/releases.md)."""
    try:
        spec = model.model_validate(dict(raw))
        named = getattr(spec, "release", None)
        if named is None and resolved:
            try:
                return spec, get_release(resolved)
            except ReleaseError:
                pass  # no longer usable (or no longer in the table): the default, like a new object
        return spec, get_release(named)
    except ValidationError as exc:
        return Problem("InvalidSpec", str(exc.errors()[0]["msg"]))
    except ReleaseError as exc:
        return Problem("ReleaseUnsupported", str(exc))


def merge_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """`new` as a JSON merge patch (RFC 7386) over `old`: a key `old` has and `new` lacks is set to None
    (removed), nested objects likewise, so that a field that went away leaves the stored object too."""
    out: dict[str, Any] = dict(new)
    for key, value in (old or {}).items():
        if key not in new:
            out[key] = None
        elif isinstance(value, Mapping) and isinstance(new[key], Mapping):
            out[key] = merge_patch(value, new[key])
    return out


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386) applied to `target`: what the API server would store (merge_patch's
    inverse: apply_merge_patch(old, merge_patch(old, new)) == new)."""
    if not isinstance(patch, Mapping):
        return patch
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out
