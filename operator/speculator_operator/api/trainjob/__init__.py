"""SpeculatorTrainJob: data -> hidden states -> training -> audit -> publish, one Kubernetes Job per stage; or,
with `convert`, a published third-party draft -> `speculators convert` -> audit -> publish.

The spec admits only the pipeline that works with the pinned speculators release (see
docs/reference/speculators.md §1): token frequencies are always written when a draft vocabulary is
set, offline runs never fall back to online generation, the extraction server's model name is the
trainer's verifier name, and hybrid hidden-state caching (gone in 0.9.0) cannot be asked for.

One module per part of the kind: inputs (the verifier, the data or a draft to convert, the draft's shape), stages
(how the stages run and where the result is published), rules (the CEL rules), spec (the spec that holds them) and
status. The CRD is generated from SpeculatorTrainJobSpec and SpeculatorTrainJobStatus (api/crds.py).
"""

from speculator_operator.api.trainjob.inputs import Convert, Data, Draft, Regenerate, TrainVerifier
from speculator_operator.api.trainjob.spec import Algorithm, SpeculatorTrainJobSpec
from speculator_operator.api.trainjob.stages import (
    SERVER_OWNED_FLAGS,
    Evaluation,
    HiddenStates,
    Output,
    PodOptions,
    Stages,
    Sweep,
    Training,
    Workspace,
)
from speculator_operator.api.trainjob.status import (
    CheckpointRef,
    EvaluationResult,
    Phase,
    Progress,
    Provenance,
    Retention,
    SpeculatorTrainJobStatus,
    StagePhase,
    StageStatus,
    SweepBest,
    SweepSummary,
)

__all__ = [
    "SERVER_OWNED_FLAGS",
    "Algorithm",
    "CheckpointRef",
    "Convert",
    "Data",
    "Draft",
    "Evaluation",
    "EvaluationResult",
    "HiddenStates",
    "Output",
    "Phase",
    "PodOptions",
    "Progress",
    "Provenance",
    "Regenerate",
    "Retention",
    "SpeculatorTrainJobSpec",
    "SpeculatorTrainJobStatus",
    "StagePhase",
    "StageStatus",
    "Stages",
    "Sweep",
    "SweepBest",
    "SweepSummary",
    "TrainVerifier",
    "Training",
    "Workspace",
]
