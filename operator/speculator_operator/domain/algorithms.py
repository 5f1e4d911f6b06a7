"""The speculators algorithms, one table: what each one is called, how the pinned vLLM serves it, since which
vLLM, how many draft passes a verification step costs, and what the audit and the trainer need to know about it.
The releases, the audit, the renderers, the trainer and the economics all read it here
(docs/reference/algorithms.md says where each fact comes from); tests/unit/test_one_table.py fails when another
module spells an algorithm's name as a literal.

The verifier families with native MTP layers are a table of their own below (`MTP_VERIFIERS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from packaging.version import Version


class Algorithm(StrEnum):
    """`speculators_model_type` of a draft checkpoint, and a train job's `spec.algorithm`."""

    EAGLE3 = "eagle3"
    PEAGLE = "peagle"
    DFLASH = "dflash"
    DFLASH2 = "dflash2"
    DSPARK = "dspark"
    MTP = "mtp"
    XPRESS = "xpress"  # a type speculators 0.9.0 defines; nothing here trains or serves it


class Family(StrEnum):
    """Checkpoints of one family share their layout (the audit's shape rules) and their training flags."""

    EAGLE = "eagle"
    DFLASH = "dflash"
    MTP = "mtp"


@dataclass(frozen=True)
class Spec:
    family: Family
    trainable: bool  # a SpeculatorTrainJob may train it (spec.algorithm)
    convertible: bool  # `speculators convert` 0.9.0 reads third-party drafts of it
    vllm_method: str | None  # the speculative config's method; None: not loadable as a draft
    min_vllm: Version | None  # the first vLLM that serves it correctly as a draft
    parallel: bool  # all K tokens in one draft pass (else one pass per token): the K rule of the economics
    mask_token: bool  # its config must name mask_token_id (the audit)
    stitched: bool = False  # served as the verifier with its own layers put back (`speculators stitch-mtp`)
    removed_vllm: Version | None = None  # the first vLLM that no longer serves it (None: every one since min_vllm)


# min_vllm, from the released vLLM wheels: eagle3 passes the aux layer ids through since 0.12.0 (0.10.1 served
# the defaults only); peagle is speculators' `peagle` type in 0.22.0; dflash is native since 0.20.0 but the
# layer-index fix (#40727) is in 0.22.0; dspark came in 0.25.0; dflash2 is speculators' `dflash2` type in 0.29.0.
# removed_vllm: 0.34.0 refuses speculators' `peagle` type ("P-EAGLE ... is not supported", transformers_utils/configs/
# speculators/algos.py) and `parallel_drafting` with eagle3 (config/speculative.py); 0.33.0 still serves both.
TABLE: dict[Algorithm, Spec] = {
    Algorithm.EAGLE3: Spec(Family.EAGLE, True, True, "eagle3", Version("0.12.0"), parallel=False, mask_token=False),
    Algorithm.PEAGLE: Spec(
        Family.EAGLE,
        True,
        False,
        "eagle3",
        Version("0.22.0"),
        parallel=True,
        mask_token=True,
        removed_vllm=Version("0.34.0"),
    ),
    Algorithm.DFLASH: Spec(Family.DFLASH, True, True, "dflash", Version("0.22.0"), parallel=True, mask_token=True),
    Algorithm.DFLASH2: Spec(Family.DFLASH, True, False, "dflash", Version("0.29.0"), parallel=True, mask_token=True),
    Algorithm.DSPARK: Spec(Family.DFLASH, True, False, "dspark", Version("0.25.0"), parallel=True, mask_token=True),
    Algorithm.MTP: Spec(Family.MTP, True, True, None, None, parallel=False, mask_token=False, stitched=True),
    Algorithm.XPRESS: Spec(Family.DFLASH, False, False, None, None, parallel=False, mask_token=True),
}

TRAINABLE = tuple(a.value for a, s in TABLE.items() if s.trainable)
KNOWN = tuple(a.value for a in TABLE)  # every speculators_model_type the audit recognises
CONVERTIBLE = tuple(a.value for a, s in TABLE.items() if s.convertible)
DFLASH_TRAINABLE = tuple(a.value for a, s in TABLE.items() if s.family is Family.DFLASH and s.trainable)
SERVED_AS_DRAFT = {a.value: s.vllm_method for a, s in TABLE.items() if s.vllm_method is not None}
MTP_METHOD = "mtp"  # vLLM's method for a model that carries its own MTP layers (a stitched one)


def spec_of(name: str | None) -> Spec | None:
    """The row of a speculators_model_type (None when it is none of them)."""
    try:
        return TABLE[Algorithm(name)] if name is not None else None
    except ValueError:
        return None


def family_of(name: str | None) -> Family | None:
    row = spec_of(name)
    return row.family if row is not None else None


def in_family(name: str | None, family: Family) -> bool:
    return family_of(name) is family


def needs_mask_token(name: str | None) -> bool:
    row = spec_of(name)
    return row is not None and row.mask_token


def drafts_in_parallel(name: str) -> bool:
    row = spec_of(name)
    return row is not None and row.parallel


@dataclass(frozen=True)
class MtpVerifier:
    trainable: bool  # speculators 0.9.0 fine-tunes the MTP layers of this model_type
    count_key: str | None  # the config key vLLM 0.32.0 reads a stitched model's MTP layer count (n_predict) from


# by the verifier's model_type: speculators 0.9.0's MTP support (models/mtp) and vLLM 0.32.0's
# hf_config_override (config/speculative.py); a multimodal top-level type holds the text one in text_config
MTP_VERIFIERS: dict[str, MtpVerifier] = {
    "qwen3": MtpVerifier(trainable=True, count_key=None),
    "qwen3_next": MtpVerifier(trainable=True, count_key="num_nextn_predict_layers"),
    "qwen3_5": MtpVerifier(trainable=False, count_key="mtp_num_hidden_layers"),
    "qwen3_5_text": MtpVerifier(trainable=True, count_key="mtp_num_hidden_layers"),
    "qwen3_5_moe": MtpVerifier(trainable=False, count_key="mtp_num_hidden_layers"),
    "qwen3_5_moe_text": MtpVerifier(trainable=True, count_key="mtp_num_hidden_layers"),
}
MTP_TRAINABLE_VERIFIERS = tuple(t for t, v in MTP_VERIFIERS.items() if v.trainable)
MTP_COUNT_KEY = {t: v.count_key for t, v in MTP_VERIFIERS.items() if v.count_key is not None}
