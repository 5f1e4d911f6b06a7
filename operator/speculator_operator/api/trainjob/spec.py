"""The SpeculatorTrainJob's spec: its inputs (inputs.py), how its stages run (stages.py) and the rules across them
(rules.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from speculator_operator.api.common import Model
from speculator_operator.api.parallelism import layout_rules
from speculator_operator.api.trainjob.inputs import Convert, Data, Draft, TrainVerifier
from speculator_operator.api.trainjob.rules import RULES, immutable
from speculator_operator.api.trainjob.stages import Evaluation, HiddenStates, Output, Stages, Training, Workspace

# the algorithm table's trainable ones, spelled out for the schema (a test checks they agree)
Algorithm = Literal["eagle3", "peagle", "dflash", "dflash2", "dspark", "mtp"]


class SpeculatorTrainJobSpec(Model):
    """The verifier, the algorithm, the data (or a draft to convert), the stages' settings and where to publish."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": list(RULES)})

    verifier: TrainVerifier = Field(json_schema_extra=immutable("verifier"))
    algorithm: Algorithm = Field(
        description="The draft's algorithm (speculators --speculator-type).", json_schema_extra=immutable("algorithm")
    )
    data: Data | None = Field(default=None, json_schema_extra=immutable("data"))
    convert: Convert | None = Field(default=None, json_schema_extra=immutable("convert"))
    draft: Draft = Field(default_factory=Draft, json_schema_extra={"default": {}, **immutable("draft")})
    hidden_states: HiddenStates = Field(
        default_factory=HiddenStates,
        json_schema_extra={
            "default": {},
            "x-kubernetes-validations": [
                *immutable("hiddenStates")["x-kubernetes-validations"],
                *layout_rules("hiddenStates"),
            ],
        },
    )
    training: Training = Field(default_factory=Training, json_schema_extra={"default": {}, **immutable("training")})
    workspace: Workspace = Field(default_factory=Workspace, json_schema_extra={"default": {}, **immutable("workspace")})
    output: Output = Field(json_schema_extra=immutable("output"))
    evaluation: Evaluation | None = Field(
        default=None,
        description="Evaluate the draft in the pinned vLLM before publishing it (an evaluate stage after the audit). "
        "It may change: a failed evaluate stage runs again with the new bounds once its Job is deleted.",
    )
    release: str | None = Field(default=None, max_length=64, description="Pinned release; default: the default one.")
    stages: Stages = Field(default_factory=Stages, json_schema_extra={"default": {}})
    retries: int = Field(
        default=2, ge=0, le=20, description="Retries of a failed stage (Kubernetes backs off 10 s, 20 s, 40 s, ...)."
    )
    deploy_to: str | None = Field(
        default=None, max_length=253, description="A SpeculatorDeployment in this namespace to serve the result."
    )

    @property
    def dataset(self) -> Data:
        """The data of a training job (a convert job has none: asking for it is a programming error)."""
        if self.data is None:
            raise ValueError("this job converts a published draft: it has no data")
        return self.data
