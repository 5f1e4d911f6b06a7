"""The serving renderer: the long-form command for the pinned vLLM and the pod around it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from speculator_operator.api.deployment import SpeculatorDeploymentSpec
from speculator_operator.domain.checkpoint.manifest import Manifest, s3_revision
from speculator_operator.domain.releases import RELEASES, Release, get_release
from speculator_operator.render.serving import Draft, Inputs, RenderError, render


def spec(**serving: Any) -> SpeculatorDeploymentSpec:
    return SpeculatorDeploymentSpec.model_validate(
        {
            "verifier": {"model": "Qwen/Qwen3-8B", "revision": "main"},
            "speculator": {"source": "hf://acme/draft"},
            "serving": serving,
        }
    )


def rendered(algo: str = "eagle3", k: int = 3, release: Release | None = None, **serving: Any) -> Any:
    return render(Inputs("qwen", "ns", spec(**serving), release or get_release(), Draft(algo, k, "d" * 40),
                         "v" * 40, "uid-1"))  # fmt: skip


def spec_config(r: Any) -> dict[str, Any]:
    args = r.vllm_args
    return json.loads(args[args.index("--speculative-config") + 1])  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("algo", "k", "method", "extra"),
    [("eagle3", 3, "eagle3", {}), ("peagle", 8, "eagle3", {"parallel_drafting": True}),
     ("dflash", 15, "dflash", {}), ("dflash2", 7, "dflash", {}), ("dspark", 8, "dspark", {})],
)  # fmt: skip
def test_method_and_k_are_explicit(algo: str, k: int, method: str, extra: dict[str, Any]) -> None:
    config = spec_config(rendered(algo, k))
    assert config == {"method": method, "model": "/models/draft", "num_speculative_tokens": k, **extra}


def test_k_override_and_cutoff_schedule() -> None:
    r = rendered("eagle3", 3, numSpeculativeTokens=5, cutoff={"maxBatchSize": 32}, maxNumSeqs=128)
    config = spec_config(r)
    assert config["num_speculative_tokens"] == 5
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 32, 5], [33, 128, 0]]
    assert "disable_by_batch_size" not in " ".join(r.vllm_args)
    assert r.notes == []


def test_cutoff_on_a_vllm_without_schedules_is_a_note_not_a_removed_flag() -> None:
    old = Release(**{**RELEASES["2026.11-vllm0.32"].__dict__, "name": "old", "vllm": "0.22.0"})
    r = rendered("eagle3", 3, release=old, cutoff={"maxBatchSize": 32})
    assert "num_speculative_tokens_per_batch_size" not in spec_config(r)
    assert "disable_by_batch_size" not in " ".join(r.vllm_args)
    assert r.notes[0][0] == "CutoffUnsupported"


def test_mtp_and_unknown_algorithms_are_refused() -> None:
    with pytest.raises(RenderError, match="stitch"):
        rendered("mtp", 3)
    with pytest.raises(RenderError, match="no drafter"):
        rendered("xpress", 3)


def stitched(k: int = 1, layers: int = 1, **serving: Any) -> Any:
    parsed = SpeculatorDeploymentSpec.model_validate({
        "verifier": {"model": "s3://models/qwen3-next"}, "speculator": {"source": "s3://drafts/qwen3-next-mtp"},
        "serving": {"numSpeculativeTokens": k, **serving},
    })  # fmt: skip
    draft = Draft("mtp", layers, "s3:abc", stitched=True)
    return render(Inputs("qwen", "ns", parsed, get_release(), draft, "s3:ver", "uid-1"))


def test_a_stitched_mtp_model_is_served_as_the_target_with_method_mtp() -> None:
    r = stitched(2, layers=1, cutoff={"maxBatchSize": 8}, maxNumSeqs=16)
    assert r.vllm_args[:2] == ["serve", "/models/draft"]  # the model itself, not the verifier beside a draft
    assert "--revision" not in r.vllm_args
    config = spec_config(r)
    assert config["method"] == "mtp"
    assert "model" not in config  # no draft model: vLLM builds the MTP layers from the target's weights
    assert config["num_speculative_tokens"] == 2
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 2], [9, 16, 0]]
    pod = r.children[0]["spec"]["template"]["spec"]
    (stage,) = pod["initContainers"]  # the stitched model only: the verifier is not staged
    assert stage["args"][:4] == ["stage", "s3://drafts/qwen3-next-mtp", "/models/draft", "--kind"]
    assert stage["args"][4] == "verifier"  # served as the target: its tokenizer comes with it
    serve = pod["containers"][0]["command"]
    assert serve[serve.index("--verifier") + 1] == "s3://models/qwen3-next"  # its config only, to audit against


def test_a_stitched_k_must_be_a_multiple_of_its_layers_above_them() -> None:
    assert spec_config(stitched(4, layers=2))["num_speculative_tokens"] == 4
    with pytest.raises(RenderError, match="not a multiple"):
        stitched(3, layers=2)


def test_pod_shape() -> None:
    r = rendered("dflash", 15, replicas=2, tensorParallelSize=2, shutdownTimeoutSeconds=90)
    deployment, service, pdb = r.children
    assert [c["kind"] for c in r.children] == ["Deployment", "Service", "PodDisruptionBudget"]
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["enableServiceLinks"] is False
    assert pod["terminationGracePeriodSeconds"] > 90
    args = c["args"]
    assert args[:4] == ["serve", "Qwen/Qwen3-8B", "--revision", "v" * 40]  # the resolved verifier commit
    assert args[args.index("--shutdown-timeout") + 1] == "90"
    assert args[args.index("--served-model-name") + 1] == "qwen"
    assert args[args.index("--tensor-parallel-size") + 1] == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["command"][:2] == ["speculator-operator", "serve"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (init,) = pod["initContainers"]
    assert init["args"][:3] == ["stage", "hf://acme/draft", "/models/draft"]
    assert service["metadata"]["name"] == "qwen"
    assert service["metadata"]["name"] != "vllm"
    assert pdb["spec"]["maxUnavailable"] == 1
    for child in r.children:
        assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_revision_moves_with_the_verifier_and_the_draft() -> None:
    base = rendered()
    s = spec()
    other_verifier = render(Inputs("qwen", "ns", s, get_release(), Draft("eagle3", 3, "d" * 40), "w" * 40, "u"))
    other_draft = render(Inputs("qwen", "ns", s, get_release(), Draft("eagle3", 3, "e" * 40), "v" * 40, "u"))
    same = render(Inputs("qwen", "ns", s, get_release(), Draft("eagle3", 3, "d" * 40), "v" * 40, "other-uid"))
    assert len({base.revision, other_verifier.revision, other_draft.revision}) == 3
    assert same.revision == base.revision
    pod_meta = base.children[0]["spec"]["template"]["metadata"]
    assert pod_meta["labels"]["speculators.dev/revision"] == base.revision


def test_name_vllm_is_refused() -> None:
    with pytest.raises(RenderError, match="VLLM_PORT"):
        render(Inputs("vllm", "ns", spec(), get_release(), Draft("eagle3", 3)))


def test_each_revision_stages_exactly_its_audited_files() -> None:
    s = SpeculatorDeploymentSpec.model_validate(
        {
            "verifier": {"model": "s3://models/qwen"},
            "speculator": {"source": "s3://drafts/qwen-eagle3"},
        }
    )
    draft_files = Manifest.from_listing({"config.json": ("c1", 10), "model.safetensors": ("w1", 99)}, "draft")
    verifier_files = Manifest.from_listing({"config.json": ("vc", 5), "tokenizer.json": ("t", 7)}, "verifier")
    exact = "s3://drafts/qwen-eagle3/sha256-0123456789abcdef"

    def pod(files: Manifest) -> dict[str, Any]:
        draft = Draft("eagle3", 3, s3_revision(files), files)
        inputs = Inputs(
            "q",
            "ns",
            s,
            get_release(),
            draft,
            "s3:v",
            draft_source=exact,
            verifier_content="s3:v",
            verifier_manifest=verifier_files,
        )
        return render(inputs).children[0]["spec"]["template"]  # type: ignore[no-any-return]

    template = pod(draft_files)
    stages = {c["name"]: c["args"] for c in template["spec"]["initContainers"]}
    draft_args = stages["stage-draft"]
    assert draft_args[:3] == ["stage", exact, "/models/draft"]  # the exact location, not the pointer
    assert Manifest.from_arg(draft_args[draft_args.index("--manifest") + 1]) == draft_files
    assert draft_args[draft_args.index("--revision") + 1] == s3_revision(draft_files)
    verifier_args = stages["stage-verifier"]
    assert verifier_args[verifier_args.index("--kind") + 1] == "verifier"
    assert Manifest.from_arg(verifier_args[verifier_args.index("--manifest") + 1]) == verifier_files
    assert template["metadata"]["annotations"]["speculators.dev/draft-location"] == exact
    command = template["spec"]["containers"][0]["command"]
    assert command[command.index("--verifier-revision") + 1] == "s3:v"  # the pod's audit checks the provenance
    # new weights under the same config: another list, another revision, another pod template
    replaced = Manifest.from_listing({"config.json": ("c1", 10), "model.safetensors": ("w2", 99)}, "draft")
    other = pod(replaced)
    assert (
        other["metadata"]["labels"]["speculators.dev/revision"]
        != template["metadata"]["labels"]["speculators.dev/revision"]
    )
