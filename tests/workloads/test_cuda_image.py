"""The images tier: the CUDA server image (`hack/build-images --cuda`), checked with podman where no GPU is, as far as
each check runs without one (docs/operations/images.md):

- the versions installed in it (not the build arguments) are the release table's, and its torch is a CUDA build;
- vLLM's own parser, engine arguments, model config and speculative-config validation accept the vLLM arguments of
  every rendered server in the render snapshots (the tiny verifier and a `speculators train --dry-run` draft of the
  right algorithm mounted where the arguments name them); the engine config, the first step that needs a device,
  is recorded;
- the entrypoint audits a staged draft, hands over to vLLM, and vLLM's failure for want of a device leaves the
  NoAccelerator exit record the operator shows.

The release is the one under check (tests/workloads/images.py: the default, or hack/qualify-release's). The image is
large and building it takes a while, so CI does not build it and this module skips, saying so, where it is not built:
`hack/test-images` builds it and runs this tier (docs/performance/test-time.md has its figures), and
hack/qualify-release builds another release's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speculator_operator import __version__
from speculator_operator.api.podcontract import ServerExit, ServerExitReason
from speculator_operator.render.serving import DRAFT_DIR, VERIFIER_DIR

from .. import render_cases
from ..lanes import REPO, run_in
from .images import qualifying, readable_copy, run_image
from .test_rendered_serving import pod_command

pytestmark = [pytest.mark.workloads, pytest.mark.images]
CHECK = REPO / "hack" / "lib" / "check_vllm_args.py"
# the steps vLLM runs before it asks the platform for a device: each must pass for every rendered server
WITHOUT_DEVICE = ("parse", "engine-args", "model-config", "speculative-config")


VERSIONS = """
import json, importlib.metadata as m, torch
names = ("vllm", "torch", "torchvision", "torchaudio", "flashinfer-python", "hs-connectors", "speculator-operator",
         "transformers")
found = {}
for n in names:
    try:
        found[n] = m.version(n)
    except m.PackageNotFoundError:
        found[n] = None
imports = {}
for mod in ("torchvision", "torchaudio", "vllm.entrypoints.openai.api_server"):
    try:
        __import__(mod)
        imports[mod] = "ok"
    except Exception as exc:
        imports[mod] = f"{type(exc).__name__}: {str(exc)[:300]}"
# vLLM's own pins (its wheel's requirements for this platform, extras left out), each installed at a version it allows
from packaging.requirements import Requirement
unmet = []
for text in m.requires("vllm") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = m.version(req.name)
    except m.PackageNotFoundError:
        unmet.append(f"{req} (not installed)")
        continue
    if not req.specifier.contains(have, prereleases=True):
        unmet.append(f"{req} (installed {have})")
print(json.dumps({"versions": found, "cuda": torch.version.cuda, "imports": imports, "unmet": unmet}))
"""


def test_the_installed_versions_are_the_release_tables_and_torch_is_a_cuda_build(
    cuda_image: str, record_property: pytest.RecordProperty
) -> None:
    release = qualifying()
    out = run_image(cuda_image, "-c", VERSIONS, entrypoint="python")
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    versions = seen["versions"]
    assert versions["vllm"] == release.vllm
    assert versions["torch"].split("+")[0] == release.torch
    assert versions["transformers"] == release.transformers
    assert versions["hs-connectors"] == release.hs_connectors
    assert versions["speculator-operator"] == __version__
    assert str(seen["cuda"]).startswith("13."), seen["cuda"]  # the CUDA 13 build of the shared torch layer
    # what vLLM itself imports at start; torchvision and torchaudio are vLLM's own pins beside this torch
    assert seen["imports"]["vllm.entrypoints.openai.api_server"] == "ok", seen["imports"]
    assert seen["unmet"] == [], f"vLLM's own pins not met in the image: {seen['unmet']}"
    record_property("detail", f"installed {json.dumps(versions)}, torch CUDA {seen['cuda']}")


# a config shaped like the served models' where the arguments need it (above)
GPU_SHAPED = {"max_position_embeddings": 131072, "num_attention_heads": 64, "num_key_value_heads": 8}


# what the kubelet puts in place of a LeaderWorkerSet group's variables (the LWS pod webhook injects them)
LWS_VALUES = {"LWS_LEADER_ADDRESS": "10.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}


def expanded(arg: str) -> str:
    for name, value in LWS_VALUES.items():
        arg = arg.replace(f"$({name})", value)
    return arg


def rendered_servers() -> tuple[list[tuple[str, list[str]]], dict[str, str]]:
    """(case/container, vLLM args) of every server the render snapshots' cases render for the release under check
    whose arguments are complete at render time (an evaluation server's `--speculate` adds its config in the pod,
    after training: the entrypoint test covers it); and the cases the renderer refused for that release, with why."""
    found: list[tuple[str, list[str]]] = []
    refused: dict[str, str] = {}

    def containers(doc: Any) -> list[dict[str, Any]]:
        if isinstance(doc, dict):
            if "containers" in doc and isinstance(doc["containers"], list):
                return [*doc["containers"], *[c for v in doc.values() for c in containers(v)]]
            return [c for v in doc.values() for c in containers(v)]
        if isinstance(doc, list):
            return [c for v in doc for c in containers(v)]
        return []

    for case, docs in render_cases.rendered_for(qualifying()):
        if isinstance(docs, Exception):
            refused[case] = str(docs)
            continue
        for doc in docs:
            for c in containers(doc):
                command, args = c.get("command") or [], c.get("args") or []
                if command[:1] != ["speculator-operator"] or command[1:2] not in (["serve"], ["vllm"]):
                    continue
                if "--speculate" in command or args[:1] != ["serve"]:
                    continue
                name = f"{case}/{(doc.get('metadata') or {}).get('name')}/{c['name']}"
                if all(name != n or args != a for n, a in found):
                    found.append((name, [expanded(a) for a in args]))
    return found, refused


def test_vllms_own_validation_accepts_every_rendered_server(
    cuda_image: str,
    workloads_env: Path,
    release_checkpoints: dict[str, Path],
    tmp_path: Path,
    record_property: pytest.RecordProperty,
) -> None:
    release = qualifying()
    servers, refused = rendered_servers()
    # a case the renderer refuses for this release names why: its vLLM lacks what the case needs
    assert all("removed" in why or "needs vLLM" in why for why in refused.values()), refused
    dry_run_checkpoints = release_checkpoints
    # a stitched MTP model is served as the target with {"method": "mtp"}: vLLM needs MTP layers in it, so those
    # servers get a Qwen3-Next with its native MTP layer (a stitched model's layout; tests/workloads/thirdparty.py)
    mtp_model = tmp_path / "qwen3-next"
    run_in(workloads_env, "python", str(REPO / "tests" / "workloads" / "thirdparty.py"), "qwen3-next-mtp",
           str(mtp_model), "--verifier", str(dry_run_checkpoints["verifier"]))  # fmt: skip
    readable_copy(mtp_model, tmp_path / "qwen3-next-readable")
    mtp_model = tmp_path / "qwen3-next-readable"
    assert len(servers) >= 10, [n for n, _ in servers]
    cases = []
    for name, args in servers:
        args = list(args)
        spec_at = args.index("--speculative-config") if "--speculative-config" in args else None
        if spec_at is not None:
            spec = json.loads(args[spec_at + 1])
            method = spec.get("method")
            if spec.get("model"):
                draft = dry_run_checkpoints.get(method) or dry_run_checkpoints["eagle3"]
                spec["model"] = f"/check/drafts/{draft.name}"
            args[spec_at + 1] = json.dumps(spec)
        stitched = spec_at is not None and json.loads(args[spec_at + 1]).get("method") == "mtp"
        args[1] = "/check/mtp-verifier" if stitched else "/check/verifier"  # the served model where it is staged
        cases.append({"name": name, "args": args})
    drafts = tmp_path / "drafts"
    drafts.mkdir()
    for key, path in dry_run_checkpoints.items():
        if key != "verifier" and not (drafts / path.name).exists():
            readable_copy(path, drafts / path.name, GPU_SHAPED)
    drafts.chmod(0o755)
    mounts = {
        readable_copy(dry_run_checkpoints["verifier"], tmp_path / "verifier", GPU_SHAPED): "/check/verifier",
        mtp_model: "/check/mtp-verifier",
        drafts: "/check/drafts",
        CHECK: "/check/check_vllm_args.py",
    }

    def checked(cases: list[dict[str, Any]], env: dict[str, str]) -> dict[str, Any]:
        out = run_image(cuda_image, "/check/check_vllm_args.py", entrypoint="python", mounts=mounts,
                        env={"HF_HUB_OFFLINE": "1", **env}, stdin=json.dumps(cases), timeout=1200)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    # without a GPU the CUDA build resolves no platform, and its serve parser already needs one (its defaults ask
    # the platform): that is the first step that needs a device
    bare = checked(cases[:1], {})
    assert bare["platform"] == ""
    assert [(s["step"], s["ok"]) for s in bare["results"][0]["steps"]] == [("parse", False)]
    # so the same wheel's code runs with its CPU platform chosen (VLLM_TARGET_DEVICE=cpu): the parser, the engine
    # arguments, the verifier's model config and the speculative-config validation are the platform-independent
    # checks of the rendered arguments; the engine config is recorded, not judged (it is the CPU platform's)
    seen = checked(cases, {"VLLM_TARGET_DEVICE": "cpu"})
    assert seen["platform"] == "cpu"
    failed = {}
    for result in seen["results"]:
        steps = {s["step"]: s for s in result["steps"]}
        for step in WITHOUT_DEVICE:
            if step not in steps or not steps[step]["ok"]:
                failed[result["name"]] = steps.get(step) or f"{step} not reached"
                break
    assert not failed, json.dumps(failed, indent=1)
    record_property(
        "detail",
        f"vLLM {release.vllm}'s parser, engine arguments, model config and speculative-config "
        f"validation accept all {len(servers)} rendered servers; the CUDA build's parser needs a device "
        "(run with VLLM_TARGET_DEVICE=cpu)"
        + "".join(f"; {case} refused by the renderer: {why}" for case, why in sorted(refused.items())),
    )


def test_the_entrypoint_audits_then_hands_over_and_no_device_says_no_accelerator(
    cuda_image: str, release_checkpoints: dict[str, Path], tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    draft = readable_copy(release_checkpoints["eagle3"], tmp_path / "draft")
    verifier = readable_copy(release_checkpoints["verifier"], tmp_path / "verifier")
    local_command, local_args = pod_command(draft, verifier, qualifying())

    def mounted(arg: str) -> str:  # back to where the pod stages them
        return arg.replace(str(draft), DRAFT_DIR).replace(str(verifier), VERIFIER_DIR)

    command, args = [mounted(a) for a in local_command], [mounted(a) for a in local_args]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out_dir.chmod(0o777)  # the image runs as a non-root user
    ran = run_image(
        cuda_image,
        *command[1:],
        *args,
        mounts={draft: DRAFT_DIR, verifier: VERIFIER_DIR, out_dir: "rw:/out"},
        env={"SPECULATOR_REPORT_PATH": "/out/termination-log", "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert ran.returncode != 0
    assert "serve: audit ok" in ran.stderr, ran.stderr[-3000:]
    record = ServerExit.decode((out_dir / "termination-log").read_text())
    assert record is not None, ran.stderr[-3000:]
    assert (record.reason, record.platform) == (ServerExitReason.NO_ACCELERATOR, "")
    assert record.exit_code == ran.returncode
    record_property("detail", "the entrypoint's audit passed, vLLM started and found no device: NoAccelerator")
