"""The children the renderers make for the examples and a spread of specs, kept as a committed snapshot.

A change that should not change what reaches the cluster (a move, a rename, a table in place of literals) is
checked against this snapshot: tests/unit/test_render_snapshot.py renders every case again and compares the
YAML byte for byte. A change that is meant to alter the children rewrites the snapshot on purpose:

    python -m tests.render_cases          # writes tests/snapshots/render/*.yaml

and the diff of those files is part of its review.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import yaml

from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.commands.render import RenderOptions, format_rendered, render_documents
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.checkpoint.manifest import FileEntry, Manifest
from speculator_operator.domain.releases import Release, get_release
from speculator_operator.render import serving, training

REPO = Path(__file__).resolve().parents[1]
SNAPSHOTS = REPO / "tests" / "snapshots" / "render"
# the renderers read these from the operator's environment; the snapshot is taken without them
ENVIRONMENT = ("SPECULATOR_IMAGE_REPOSITORY", "SPECULATOR_IMAGE_DIGESTS")


def _example(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((REPO / "examples" / name).read_text()) if d]


TRAIN_BASE: dict[str, Any] = {
    "verifier": {"model": "Qwen/Qwen3-8B"},
    "algorithm": "eagle3",
    "data": {"sources": ["hf:HuggingFaceH4/ultrachat_200k"]},
    "output": {"uri": "s3://drafts/qwen3-8b"},
}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:  # a key the case leaves out
            out.pop(key, None)
            continue
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# the release every case renders with instead of its spec's (None: the spec's): `rendered_for` sets it, for the
# images tier's check of another release's vLLM against the same cases (hack/qualify-release)
RELEASE: Release | None = None


def _release(name: str | None) -> Release:
    return RELEASE or get_release(name)


def _train(name: str, spec: dict[str, Any], layers: int = 36) -> list[dict[str, Any]]:
    parsed = SpeculatorTrainJobSpec.model_validate(spec)
    release = _release(parsed.release)
    inputs = training.Inputs(name, "ml", parsed, release, "abc123", layers, "uid-1", verifier_content="s3:ver")
    return training.render_all(inputs)


TRAIN_CASES: dict[str, dict[str, Any]] = {
    **{f"train-{a}": {"algorithm": a} for a in ("eagle3", "peagle", "dflash", "dflash2", "dspark", "mtp")},
    "train-online": {"hiddenStates": {"mode": "online"}},
    "train-regenerate": {"data": {"regenerate": {"dataset": "ultrachat", "limit": 10}}},
    "train-two-nodes": {"training": {"nodes": 2, "gpusPerNode": 4}},
    "train-evaluated": {
        "evaluation": {"minAcceptance": 0.6, "minSpeedup": 1.3, "heldOut": 32, "numSpeculativeTokens": 4},
        "hiddenStates": {"extraArgs": ["--max-model-len", "8192"]},
    },
    "train-swept": {"evaluation": {"heldOut": 32, "sweep": {"maxConcurrency": 16}}},
    "train-convert": {
        "data": None,
        "draft": {"targetLayerIds": [1, 17, 32]},
        "convert": {
            "source": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
            "revision": "v1",
            "credentials": {"name": "hub"},
        },
    },
    "train-convert-pvc": {"data": None, "convert": {"source": "pvc://drafts/eagle3/v2"}},
    "train-publish-pvc": {"output": {"uri": "pvc://drafts/qwen/v1"}, "workspace": {"accessMode": "ReadWriteMany"}},
    # a verifier larger than one node: each extraction server is a two-pod LeaderWorkerSet group
    "train-extract-two-nodes": {
        "hiddenStates": {"backend": "fp8", "replicas": 2, "tensorParallelSize": 8, "parallelism": {"nodes": 2}}
    },
}


def _serve(name: str, spec: dict[str, Any], draft: serving.Draft) -> list[dict[str, Any]]:
    parsed = SpeculatorDeploymentSpec.model_validate(spec)
    inputs = serving.Inputs(name, "ns", parsed, _release(parsed.release), draft, "v" * 40, "uid-1")
    return serving.render(inputs).children


SERVE_BASE: dict[str, Any] = {
    "verifier": {"model": "Qwen/Qwen3-8B", "revision": "main"},
    "speculator": {"source": "hf://acme/draft"},
}
MANIFEST = Manifest(
    (FileEntry("config.json", '"c0ffee"', 812), FileEntry("model.safetensors", '"beef-2"', 104_857_600))
)
SERVE_CASES: dict[str, tuple[dict[str, Any], serving.Draft]] = {
    **{
        f"serve-{a}": ({}, serving.Draft(a, k, "d" * 40))
        for a, k in (("eagle3", 3), ("peagle", 8), ("dflash", 15), ("dflash2", 7), ("dspark", 8))
    },
    "serve-cutoff": (
        {"serving": {"numSpeculativeTokens": 5, "cutoff": {"maxBatchSize": 32}, "maxNumSeqs": 128}},
        serving.Draft("eagle3", 3, "d" * 40),
    ),
    "serve-s3-manifest": (
        {"verifier": {"model": "s3://models/qwen3"}, "speculator": {"source": "s3://drafts/qwen3-eagle3"}},
        serving.Draft("eagle3", 3, "s3:abc", MANIFEST),
    ),
    "serve-two-nodes": (
        {"serving": {"replicas": 2, "parallelism": {"tensor": 8, "pipeline": 2, "nodes": 2}}},
        serving.Draft("eagle3", 3, "s3:abc", MANIFEST),
    ),
    "serve-data-parallel-cutoff": (
        {"serving": {"parallelism": {"data": 4, "nodes": 2}, "cutoff": {"maxBatchSize": 32}}},
        serving.Draft("eagle3", 3, "d" * 40),
    ),
    "serve-dspark-adaptive": ({"serving": {"adaptiveVerification": True}}, serving.Draft("dspark", 8, "d" * 40)),
    "serve-learning-s3": (
        {
            "serving": {"replicas": 2},
            "upgradePolicy": {"canary": {"replicas": 1}, "trainTemplate": {"algorithm": "eagle3"}},
            "learning": {
                "capture": {"fraction": 0.1, "redact": [{"pattern": "[0-9]{13,19}"}]},
                "storage": {"location": "s3://captures/qwen3", "credentials": {"name": "capture-writer"}},
            },
        },
        serving.Draft("eagle3", 3, "d" * 40),
    ),
    "serve-stitched-mtp": (
        {
            "verifier": {"model": "s3://models/qwen3-next"},
            "speculator": {"source": "s3://drafts/qwen3-next-mtp"},
            "serving": {"numSpeculativeTokens": 2, "cutoff": {"maxBatchSize": 8}, "maxNumSeqs": 16},
        },
        serving.Draft("mtp", 1, "s3:abc", stitched=True),
    ),
}


# The GPU examples as a plain `speculator-operator render FILE...` prints them where their weights cannot be read
# (gated hub repos, no network): every checkpoint and verifier read fails, the render uses what each manifest
# declares (speculator.algorithm/speculativeTokens, verifier.numHiddenLayers), and the output says that the audit
# was not run and why. No stand-in checkpoint exists under their names.
GPU = REPO / "examples" / "gpu"
GPU_CASES: dict[str, tuple[tuple[str, ...], RenderOptions]] = {
    "gpu-llama-3.1-8b-eagle3-trainjob": (("llama-3.1-8b-eagle3-trainjob.yaml",), RenderOptions()),
    "gpu-llama-3.1-8b-eagle3-deployment": (("llama-3.1-8b-eagle3-deployment.yaml",), RenderOptions()),
    "gpu-qwen3-8b-dflash-deployment": (("qwen3-8b-dflash-deployment.yaml",), RenderOptions()),
    "gpu-qwen3-8b-dflash-trainjob": (("qwen3-8b-dflash-trainjob.yaml",), RenderOptions()),
    "gpu-llama-3.1-405b-multinode": (
        ("llama-3.1-405b-eagle3-trainjob.yaml", "llama-3.1-405b-multinode-deployment.yaml"),
        RenderOptions(),
    ),
}


def _unreadable(location: str, **_: Any) -> NoReturn:
    raise CheckpointError(f"{location}: not read (the snapshot is rendered without network access)")


def _gpu(files: tuple[str, ...], options: RenderOptions) -> str:
    docs = [(f, d) for f in files for d in yaml.safe_load_all((GPU / f).read_text()) if d]
    if RELEASE is not None:
        options = dataclasses.replace(options, release=RELEASE.name)
    return format_rendered(render_documents(docs, options, audit_draft=_unreadable, read_config=_unreadable))


def cases() -> Iterator[tuple[str, Callable[[], list[dict[str, Any]] | str]]]:
    """(case name, a function that renders its children, or the CLI's whole output)."""
    for doc in _example("speculatortrainjob.yaml"):
        yield f"example-{doc['metadata']['name']}", lambda doc=doc: _train(doc["metadata"]["name"], doc["spec"], 8)
    for doc in _example("speculatordeployment.yaml"):
        draft = serving.Draft("eagle3", 3, "s3:abc")
        yield (
            f"example-{doc['metadata']['name']}",
            lambda doc=doc, draft=draft: _serve(doc["metadata"]["name"], doc["spec"], draft),
        )
    for name, over in TRAIN_CASES.items():
        yield name, lambda name=name, over=over: _train(name, _merged(TRAIN_BASE, over))
    for name, (over, draft) in SERVE_CASES.items():
        yield name, lambda name=name, over=over, draft=draft: _serve(name, _merged(SERVE_BASE, over), draft)
    for name, (files, options) in GPU_CASES.items():
        yield name, lambda files=files, options=options: _gpu(files, options)


def rendered_for(release: Release) -> Iterator[tuple[str, list[dict[str, Any]] | Exception]]:
    """Every case rendered with `release` instead of its spec's: (case, its documents, or what the renderer refused
    it with: a release whose vLLM lacks a feature refuses the cases that need it)."""
    global RELEASE
    RELEASE = release
    try:
        for name, fn in cases():
            try:
                out = fn()
            except Exception as exc:
                yield name, exc
                continue
            yield name, [d for d in yaml.safe_load_all(out) if d] if isinstance(out, str) else out
    finally:
        RELEASE = None


def render_case(fn: Callable[[], list[dict[str, Any]] | str]) -> str:
    saved = {k: os.environ.pop(k) for k in ENVIRONMENT if k in os.environ}
    try:
        out = fn()
        if isinstance(out, str):
            return out
        return "---\n".join(yaml.safe_dump(d, sort_keys=False, width=120) for d in out)
    finally:
        os.environ.update(saved)


def main() -> int:
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    names = set()
    for name, fn in cases():
        (SNAPSHOTS / f"{name}.yaml").write_text(render_case(fn))
        names.add(f"{name}.yaml")
    for stale in SNAPSHOTS.glob("*.yaml"):
        if stale.name not in names:
            stale.unlink()
    print(f"render_cases: {len(names)} snapshots in {SNAPSHOTS.relative_to(REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
