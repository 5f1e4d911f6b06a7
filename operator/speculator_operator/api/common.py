"""Pieces shared by every kind: the API group, camelCase models, conditions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
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
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(description="A CamelCase reason; the kind's docs list them.")
    message: str = ""
    observed_generation: int | None = Field(default=None, description="The .metadata.generation this was set for.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last status change.")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]], new: Condition) -> list[dict[str, Any]]:
    """Conditions with `new` merged in; the transition time moves only when the status changes."""
    out = []
    found = False
    for c in conditions:
        if c.get("type") == new.type:
            found = True
            merged = new.wire()
            same = c.get("status") == new.status
            merged["lastTransitionTime"] = c.get("lastTransitionTime") if same else (new.last_transition_time or now())
            out.append(merged)
        else:
            out.append(c)
    if not found:
        d = new.wire()
        d.setdefault("lastTransitionTime", now())
        out.append(d)
    return out


def condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def make_condition(generation: int, type_: str, ok: bool | None, reason: str, message: str = "") -> Condition:
    """A condition for `generation`: ok True/False, or None for Unknown; messages are kept to 1500 chars."""
    status: Literal["True", "False", "Unknown"] = "Unknown" if ok is None else ("True" if ok else "False")
    return Condition(type=type_, status=status, reason=reason, message=message[:1500], observed_generation=generation)


def merge_status(status: dict[str, Any], generation: int, *conds: Condition, **fields: Any) -> dict[str, Any]:
    """`status` with the conditions merged in, observedGeneration set and `fields` set (None removes a key)."""
    out = dict(status)
    conditions = list(out.get("conditions") or [])
    for c in conds:
        conditions = set_condition(conditions, c)
    out["conditions"] = conditions
    out["observedGeneration"] = generation
    out.update(fields)
    return {k: v for k, v in out.items() if v is not None}
