"""The SpeculatorDeployment's inputs: the verifier and the draft it serves (a SpeculatorTrainJob's verifier extends
this Verifier)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from speculator_operator.api.common import Model, SecretRef
from speculator_operator.domain.location import Location, Scheme

# what a draft served by vLLM can be (speculators_model_type; mtp: a head stitched into its verifier), spelled out
# for the schema (tests/unit/test_one_table.py checks it against the algorithm table)
DeclaredAlgorithm = Literal["eagle3", "peagle", "dflash", "dflash2", "dspark", "mtp"]


class Verifier(Model):
    """The target model the draft speculates for."""

    model: str = Field(
        min_length=1,
        max_length=512,
        pattern=r"^((hf://)?[A-Za-z0-9][\w.-]*/[\w.-]+|s3://[a-z0-9][a-z0-9.-]*(/.*)?|pvc://[a-z0-9][a-z0-9.-]*(/.*)?)$",
        description="Hugging Face repo id (org/name or hf://org/name), s3://bucket/prefix, or pvc://claim/path.",
    )
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=255,
        description="Branch, tag or commit of a hub model; the operator resolves it to a commit sha. "
        "For s3:// the revision is a digest over every file vLLM reads (name, ETag, size); pvc:// is not read "
        "by the operator.",
    )
    quantization: str | None = Field(default=None, max_length=64, description="vLLM --quantization for the verifier.")
    credentials: SecretRef | None = Field(
        default=None,
        description="Secret with HF_TOKEN and/or AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL.",
    )

    @property
    def location(self) -> Location:
        """The model's location (a bare org/name is a hub id)."""
        return Location.parse(self.model, bare=Scheme.HUB)

    @property
    def is_hub(self) -> bool:
        return self.location.is_hub

    @property
    def uri(self) -> str:
        """hf://org/name, s3://..., or pvc://... (a bare org/name is a hub id)."""
        return self.location.uri

    @property
    def config_location(self) -> str | None:
        """Where the operator reads the verifier's config.json (pinned to `revision` on the hub); None
        for pvc://, which only the pods mount."""
        if self.location.is_pvc:
            return None
        return f"{self.uri}@{self.revision}" if self.is_hub else self.model


class Speculator(Model):
    """The draft: exactly one of source or fromTrainJob."""

    source: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^(hf://[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?|s3://[a-z0-9][a-z0-9.-]*(/.*)?|pvc://[a-z0-9][a-z0-9.-]*(/.*)?)$",
        description="Draft checkpoint: hf://org/repo[@revision], s3://bucket/prefix or pvc://claim/path. An s3:// "
        "prefix that holds a train job's `speculators-latest.json` pointer (its output.uri) is resolved to the "
        "exact location the pointer names when it is audited.",
    )
    from_train_job: str | None = Field(
        default=None,
        max_length=253,
        description="Name of a SpeculatorTrainJob in this namespace whose output to serve.",
    )
    credentials: SecretRef | None = Field(default=None, description="Secret for the draft's storage (as verifier).")
    algorithm: DeclaredAlgorithm | None = Field(
        default=None,
        description="The draft's algorithm as you expect it (its speculators_model_type; mtp for an MTP head "
        "stitched into its verifier). Optional: the audit refuses a checkpoint that says otherwise (rule "
        "declared-draft), so a hub branch that moves cannot swap the kind of draft served, and an offline "
        "`speculator-operator render` (no network, or a train job not yet published) renders from it.",
    )
    speculative_tokens: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="The checkpoint's speculative_tokens as you expect it (an MTP model's layer count), for an "
        "offline render; the audit warns (rule declared-draft) where the checkpoint says otherwise. Not the "
        "served K: that is serving.numSpeculativeTokens (auto: the checkpoint's own).",
    )
