"""The SpeculatorTrainJob's CEL rules: what a run was started with is immutable (a transition rule on each such field),
and the rules across fields that admit only the pipeline the pinned speculators release runs."""

from __future__ import annotations

from typing import Any

from speculator_operator.domain.algorithms import CONVERTIBLE, DFLASH_TRAINABLE
from speculator_operator.domain.algorithms import Algorithm as Algo


def immutable(field: str) -> dict[str, Any]:
    """A transition rule: like a Job's pod template, what a run was started with does not change under it."""
    return {"x-kubernetes-validations": [{
        "rule": "self == oldSelf",
        "message": f"{field} is immutable once the job exists: delete and re-create the job to change it "
        "(retries, stages and deployTo may change)",
    }]}  # fmt: skip


def _cel(names: tuple[str, ...]) -> str:
    """A CEL list literal of names."""
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


RULES: list[Any] = [
    {
        "rule": "has(self.data) != has(self.convert)",
        "message": "give data (to train a draft) or convert (to convert a published one), exactly one of them",
    },
    {
        "rule": f"!has(self.convert) || self.algorithm in {_cel(CONVERTIBLE)}",
        "message": "speculators 0.9.0 converts eagle3 (SafeAILab EAGLE-3), dflash (z-lab DFlash) and mtp (native MTP "
        "layers) checkpoints only",
        "fieldPath": ".algorithm",
    },
    {
        "rule": "!has(self.convert) || (!has(self.draft.numLayers) && !has(self.draft.draftArch) && "
        "!has(self.draft.draftVocabSize) && !has(self.draft.blockSize) && !has(self.draft.tttSteps) && "
        "!has(self.draft.numDepths) && !has(self.draft.fromPretrained))",
        "message": "a converted draft keeps the source's shape: of draft, only targetLayerIds (eagle3, dflash) and "
        "numSpeculativeSteps (mtp) apply",
        "fieldPath": ".draft",
    },
    {
        "rule": f"!has(self.convert) || !has(self.draft.targetLayerIds) || self.algorithm != '{Algo.MTP}'",
        "message": "an MTP head reads the verifier's last layer: draft.targetLayerIds does not apply",
        "fieldPath": ".draft.targetLayerIds",
    },
    {
        "rule": f"!has(self.convert) || !has(self.convert.normBeforeResidual) || self.algorithm == '{Algo.EAGLE3}'",
        "message": "convert.normBeforeResidual is an eagle3 setting",
        "fieldPath": ".convert.normBeforeResidual",
    },
    {
        "rule": "!has(self.convert) || ((!has(self.training.nodes) || self.training.nodes == 1) && "
        "(!has(self.training.fsdp) || !self.training.fsdp) && (!has(self.training.dryRun) || !self.training.dryRun) "
        "&& (!has(self.training.extraArgs) || size(self.training.extraArgs) == 0) && !has(self.training.lr))",
        "message": "a converted draft is not trained: leave training out",
        "fieldPath": ".training",
    },
    {
        "rule": "!has(self.convert) || !has(self.convert.revision) || self.convert.source.startsWith('hf://')",
        "message": "convert.revision applies to a hub source (hf://)",
        "fieldPath": ".convert.revision",
    },
    {
        "rule": "!has(self.data) || (has(self.data.sources) && size(self.data.sources) > 0) || "
        "has(self.data.regenerate)",
        "message": "data needs sources or regenerate",
        "fieldPath": ".data",
    },
    {
        "rule": "!has(self.data) || !has(self.data.regenerate) || !has(self.data.sources) || "
        "size(self.data.sources) == 0 || self.data.format == 'pretokenized'",
        "message": "data.regenerate with conversation sources: speculators 0.9.0's prepare-data cannot combine "
        "regenerated rows with rendered conversations in one dataset; regenerate those sources too "
        "(data.regenerate.dataset) or give pretokenized sources",
        "fieldPath": ".data.sources",
    },
    {
        "rule": "!has(self.evaluation) || has(self.data) || (has(self.evaluation.prompts) && "
        "size(self.evaluation.prompts) > 0)",
        "message": "a convert job has no data to hold out: evaluation.prompts names what to evaluate",
        "fieldPath": ".evaluation.prompts",
    },
    {
        "rule": "!has(self.evaluation) || !has(self.data) || !has(self.data.maxSamples) || "
        "has(self.evaluation.prompts) || self.data.maxSamples > self.evaluation.heldOut",
        "message": "evaluation.heldOut must leave samples to train on: it must be below data.maxSamples",
        "fieldPath": ".evaluation.heldOut",
    },
    {
        "rule": "self.hiddenStates.mode == 'online' || self.hiddenStates.backend != 'mooncake'",
        "message": "offline hidden states need a file-like backend (file or fp8): generate-offline-data cannot "
        "use mooncake",
        "fieldPath": ".hiddenStates.backend",
    },
    {
        "rule": "self.hiddenStates.backend != 'mooncake' || has(self.hiddenStates.mooncakeMaster)",
        "message": "the mooncake backend needs hiddenStates.mooncakeMaster",
        "fieldPath": ".hiddenStates.mooncakeMaster",
    },
    {
        "rule": "self.hiddenStates.mode == 'offline' || self.hiddenStates.backend == 'mooncake' || "
        "self.workspace.accessMode == 'ReadWriteMany'",
        "message": "online hidden states with the file or fp8 backend need a ReadWriteMany workspace (vLLM and "
        "the trainer share files at one path) or the mooncake backend",
        "fieldPath": ".workspace.accessMode",
    },
    {
        "rule": "self.training.nodes == 1 || self.workspace.accessMode == 'ReadWriteMany'",
        "message": "training on several nodes needs a ReadWriteMany workspace",
        "fieldPath": ".workspace.accessMode",
    },
    {
        "rule": f"!(self.algorithm in {_cel(DFLASH_TRAINABLE)}) || !has(self.draft.blockSize) || "
        "self.draft.blockSize >= 2",
        "message": "DFlash-family drafts need draft.blockSize >= 2",
        "fieldPath": ".draft.blockSize",
    },
    {
        "rule": f"self.algorithm != '{Algo.MTP}' || (!has(self.draft.draftVocabSize) && !has(self.draft.numLayers) && "
        "!has(self.draft.draftArch))",
        "message": "mtp finetunes the verifier's own MTP layers: draftVocabSize, numLayers and draftArch do not apply",
        "fieldPath": ".draft",
    },
    {
        "rule": "!has(self.draft.fromPretrained) || (!has(self.draft.numLayers) && !has(self.draft.draftArch))",
        "message": "draft.fromPretrained fixes the draft's shape: leave numLayers and draftArch out",
        "fieldPath": ".draft.fromPretrained",
    },
    {
        "rule": "!self.verifier.model.startsWith('pvc://')",
        "message": "a SpeculatorTrainJob reads the verifier's config.json to choose the layers to extract: use a "
        "hub id or s3://",
        "fieldPath": ".verifier.model",
    },
    {
        "rule": "!has(self.draft.targetLayerIds) || "
        "self.draft.targetLayerIds.all(i, self.draft.targetLayerIds.exists_one(j, j == i))",
        "message": "draft.targetLayerIds must be distinct",
        "fieldPath": ".draft.targetLayerIds",
    },
]
