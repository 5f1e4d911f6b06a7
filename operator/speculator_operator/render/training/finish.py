"""The stages after training or converting: the audit of the checkpoint (an mtp head: the verifier it was
stitched into) against its verifier and the pinned vLLM, and the publish."""

from __future__ import annotations

import json

from speculator_operator.domain.location import Location
from speculator_operator.render.training import common
from speculator_operator.render.training.common import OUTPUT_MOUNT, VERIFIER, Inputs, Stage, final_checkpoint


def audit_stage(inputs: Inputs) -> Stage:
    checkpoint = final_checkpoint(inputs)
    command = ["speculator-operator", "trainer", "audit", checkpoint, "--verifier", VERIFIER]
    command += ["--release", inputs.release.name]
    container = common.make_container(inputs.release.image("trainer"), command)
    # 1: audit errors, 2: unreadable checkpoint - neither changes on a retry
    job = common.make_job(inputs, "audit", inputs.spec.stages.cpu, container, fail_fast_codes=(1, 2))
    return Stage("audit", "Auditing", [job], command=command)


def publish_stage(inputs: Inputs) -> Stage:
    spec = inputs.spec
    uri = spec.output.uri
    volumes, mounts = [], []
    target = uri
    output = Location.parse(uri)
    if output.is_pvc:
        volumes = [{"name": "output", "persistentVolumeClaim": {"claimName": output.root}}]
        mounts = [{"name": "output", "mountPath": OUTPUT_MOUNT}]
        target = f"{OUTPUT_MOUNT}/{output.path}"
    command = [
        "speculator-operator", "trainer", "publish", final_checkpoint(inputs), target,
        "--verifier", spec.verifier.location.root if spec.verifier.is_hub else spec.verifier.uri,
        "--verifier-revision", inputs.verifier_revision or spec.verifier.revision,
        "--job", f"{inputs.namespace}/{inputs.name}",
        "--release", inputs.release.name,
        "--uri", uri,
    ]  # fmt: skip
    if inputs.verifier_content:
        command += ["--verifier-content", inputs.verifier_content]
    if inputs.evaluation:
        command += ["--evaluation", json.dumps(inputs.evaluation, separators=(",", ":"), sort_keys=True)]
    if inputs.sweep:
        command += ["--sweep", json.dumps(inputs.sweep, separators=(",", ":"), sort_keys=True)]
    container = common.make_container(
        inputs.release.image("trainer"),
        command,
        envFrom=common.secret_envs(spec.output.credentials),
        volumeMounts=mounts,
    )
    job = common.make_job(inputs, "publish", spec.stages.cpu, container, extra_volumes=volumes)
    return Stage("publish", "Publishing", [job], command=command)
