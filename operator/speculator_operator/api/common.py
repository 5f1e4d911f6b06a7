"""Pieces shared by every kind: the API group, camelCase models, conditions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

GROUP = "speculators.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "speculators"


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are refused (the CRD prunes them)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class SecretRef(Model):
    """A Secret in the resource's namespace."""

    name: str = Field(min_length=1, max_length=253, description="Name of the Secret.")


class Condition(Model):
    """A metav1.Condition."""

    type: str = Field(description="Ready, Audited, VerifierCurrent, Serving, ...")
    status: Literal["True", "False", "Unknown"] = Field(
        description="True, False, or Unknown (not known yet, e.g. too few samples to judge)."
    )
    reason: str = Field(
        description="A CamelCase reason for the status; docs/operations/troubleshooting.md lists every reason the "
        "operator sets, what it means and what to do."
    )
    message: str = Field(default="", description="What happened, in words, with the figures (at most 1500 characters).")
    observed_generation: int | None = Field(default=None, description="The .metadata.generation this was set for.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last status change.")


def stamp(at: datetime) -> str:
    """`at` as the status writes a time: RFC 3339 in UTC, to the second."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]], new: Condition, now: datetime) -> list[dict[str, Any]]:
    """Conditions with `new` merged in at `now` (the pass's time, read once by its caller: nothing here reads a
    clock); the transition time moves only when the status changes, to `new`'s own time or else `now`."""
    out = []
    found = False
    for c in conditions:
        if c.get("type") == new.type:
            found = True
            merged = new.wire()
            same = c.get("status") == new.status
            merged["lastTransitionTime"] = (
                c.get("lastTransitionTime") if same else (new.last_transition_time or stamp(now))
            )
            out.append(merged)
        else:
            out.append(c)
    if not found:
        d = new.wire()
        d.setdefault("lastTransitionTime", stamp(now))
        out.append(d)
    return out


def condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def make_condition(generation: int, type_: str, ok: bool | None, reason: str, message: str = "") -> Condition:
    """A condition for `generation`: ok True/False, or None for Unknown; messages are kept to 1500 chars."""
    status: Literal["True", "False", "Unknown"] = "Unknown" if ok is None else ("True" if ok else "False")
    return Condition(type=type_, status=status, reason=reason, message=message[:1500], observed_generation=generation)


def merge_status(
    status: dict[str, Any], generation: int | None, *conds: Condition, now: datetime | None = None, **fields: Any
) -> dict[str, Any]:
    """`status` with the conditions merged in at `now` (set_condition; required with any condition), observedGeneration
    set (left as stored when `generation` is None) and `fields` set (None removes a key)."""
    if conds and now is None:
        raise TypeError("conditions are merged at a time: pass now (the pass's time)")
    out = dict(status)
    if conds or generation is not None:
        conditions = list(out.get("conditions") or [])
        for c in conds:
            assert now is not None
            conditions = set_condition(conditions, c, now)
        out["conditions"] = conditions
    if generation is not None:
        out["observedGeneration"] = generation
    out.update(fields)
    return {k: v for k, v in out.items() if v is not None}


S = TypeVar("S", bound=Model)


def stored(status: BaseModel) -> dict[str, Any]:
    """A status model as the API server stores it: camelCase, only the keys that were set (a default the
    planner never set is not written) and none that is None (in a merge patch a null removes a key)."""
    return status.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")


def evolve(status: S, generation: int | None, *conds: Condition, now: datetime | None = None, **fields: Any) -> S:
    """`status` with the conditions merged by type at `now` (`set_condition`; required with any condition),
    observedGeneration set (left as it is when `generation` is None) and `fields` set by their Python names (None
    removes one). The result is validated: a field the model has no name for is a TypeError here, a value of the
    wrong shape a ValidationError, where a dict would have been pruned by the API server without a word."""
    model = type(status)
    unknown = sorted(set(fields) - set(model.model_fields))
    if unknown:
        raise TypeError(f"{model.__name__} has no field {', '.join(unknown)}")
    wire = {model.model_fields[k].alias or k: _wire(v) for k, v in fields.items()}
    return model.model_validate(merge_status(stored(status), generation, *conds, now=now, **wire))


def _wire(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return stored(value)
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value


def conditions_of(status: Model) -> dict[str, Condition]:
    """A status's conditions by type."""
    return {c.type: c for c in getattr(status, "conditions", None) or []}


def read_status(model: type[Model], raw: dict[str, Any]) -> dict[str, Any]:
    """A stored status as the status model knows it: what it has no field for (a key an older operator wrote), or
    holds in a form it does not take, is left out rather than refused, so that a pass never fails on what it
    reads; the rest comes back exactly as stored (camelCase, only the keys given)."""
    data = json.loads(json.dumps(raw))
    for _ in range(64):  # each round drops at least one key
        try:
            return model.model_validate(data).model_dump(by_alias=True, exclude_unset=True, mode="json")
        except ValidationError as exc:
            # a required key that is missing: the object that lacks it goes (it cannot stand without it)
            dropped = sum(
                _drop(data, err["loc"][:-1] if err["type"] == "missing" else err["loc"]) for err in exc.errors()
            )
            if not dropped:
                break
    return {}


def _drop(data: Any, loc: tuple[int | str, ...]) -> bool:
    """Remove what `loc` (a validation error's place) points at; False when it is not there."""
    if not loc:
        return False
    for part in loc[:-1]:
        if not _holds(data, part):
            return False
        data = data[part]
    if not _holds(data, loc[-1]):
        return False
    del data[loc[-1]]
    return True


def _holds(data: Any, part: int | str) -> bool:
    if isinstance(data, dict):
        return part in data
    return isinstance(data, list) and isinstance(part, int) and part < len(data)


def typed_status(model: type[S], raw: dict[str, Any]) -> S:
    """A stored status as its model (what `read_status` keeps of it)."""
    return model.model_validate(read_status(model, raw))


def status_problems(model: type[Model], status: dict[str, Any]) -> list[str]:
    """What of a status about to be written its model does not take: a key it has no field for (the API server
    would prune it without a word), a key in snake_case, a value of the wrong type. Empty when it is sound."""
    try:
        dumped = model.model_validate(status).model_dump(by_alias=True, exclude_unset=True, mode="json")
    except ValidationError as exc:
        return [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in exc.errors()]
    return [f"{path}: not a field of {model.__name__}" for path in _unknown(status, dumped, "")]


def _unknown(given: Any, dumped: Any, path: str) -> list[str]:
    if isinstance(given, dict) and isinstance(dumped, dict):
        out = []
        for key, value in given.items():
            if value is None:
                continue
            if key not in dumped:
                out.append(f"{path}{key}")
            else:
                out += _unknown(value, dumped[key], f"{path}{key}.")
        return out
    if isinstance(given, list) and isinstance(dumped, list) and len(given) == len(dumped):
        return [p for i, (a, b) in enumerate(zip(given, dumped, strict=True)) for p in _unknown(a, b, f"{path}{i}.")]
    return []
