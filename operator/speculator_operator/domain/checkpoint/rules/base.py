"""The audit's rule machinery: findings and their severities, the context every rule reads, the registry
(`rule` appends to RULES, `run_rules` runs it in that order), and the small helpers the families use.

The families of rules (config, tensors, algorithm, verifier, vllm, deep) register here as they are imported;
rules/__init__.py imports them in the order the findings come out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeGuard

from speculator_operator.domain.algorithms import KNOWN, Family
from speculator_operator.domain.checkpoint.model import Checkpoint
from speculator_operator.domain.checkpoint.safetensors_header import TensorInfo
from speculator_operator.domain.releases import Version

KNOWN_TYPES = KNOWN


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": str(self.severity), "message": self.message}


@dataclass
class AuditContext:
    checkpoint: Checkpoint
    verifier: dict[str, Any] | None = None  # the verifier's config.json
    served_verifier: str | None = None  # the verifier name/uri that will be served
    verifier_revision: str | None = None  # its resolved revision (hub commit sha, s3 listing digest)
    verifier_content: str | None = None  # the identity of the verifier files vLLM reads (Source.content)
    vllm: Version | None = None
    allow_lossy: bool = False
    deep: bool = False
    declared: tuple[str | None, int | None] = (None, None)  # the spec's speculator.algorithm/speculativeTokens
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def verifier_text(self) -> dict[str, Any]:
        """The verifier's text config (multimodal verifiers nest it under text_config)."""
        if self.verifier is None:
            return {}
        text = self.verifier.get("text_config")
        return text if isinstance(text, dict) else self.verifier

    def verifier_int(self, key: str) -> int | None:
        value = self.verifier_text.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


RuleFn = Callable[[AuditContext], Iterable["str | Finding"]]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    summary: str
    fn: RuleFn
    needs: str = ""  # "verifier", "vllm" or "deep": skipped without it


RULES: list[Rule] = []


def rule(rule_id: str, severity: Severity, summary: str, needs: str = "") -> Callable[[RuleFn], RuleFn]:
    def register(fn: RuleFn) -> RuleFn:
        if any(r.id == rule_id for r in RULES):
            raise ValueError(f"duplicate audit rule id {rule_id}")
        RULES.append(Rule(rule_id, severity, summary, fn, needs))
        return fn

    return register


def run_rules(ctx: AuditContext) -> list[Finding]:
    findings: list[Finding] = []
    for r in RULES:
        if r.needs == "verifier" and ctx.verifier is None:
            continue
        if r.needs == "vllm" and ctx.vllm is None:
            continue
        if r.needs == "deep" and not ctx.deep:
            continue
        try:
            for item in r.fn(ctx):
                findings.append(item if isinstance(item, Finding) else Finding(r.id, r.severity, item))
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
            findings.append(Finding(r.id, Severity.ERROR, f"could not be checked: {type(exc).__name__}: {exc}"))
    return findings


# ------------------------------------------------------------------------------------------ helpers


def _shape(t: TensorInfo | None) -> list[int] | None:
    return None if t is None else list(t.shape)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _aux_count(ck: Checkpoint) -> int | None:
    """How many aux hidden states the fc layer concatenates (each family's default applied)."""
    ids = ck.config.get(ck.aux_ids_key)
    if ck.family == Family.EAGLE:
        return len(ids) if isinstance(ids, list) and ids else 3
    if ck.family == Family.DFLASH:
        return len(ids) if isinstance(ids, list) else None
    return None


def _known(ck: Checkpoint) -> bool:
    return ck.algorithm in KNOWN_TYPES
