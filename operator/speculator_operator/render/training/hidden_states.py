"""Hidden states: the extraction stage (`speculators generate-offline-data`) and the vLLM servers the stages
talk to (the plain verifier for regenerate and render, the extraction server, the evaluation server)."""

from __future__ import annotations

import json
from typing import Any

from speculator_operator.api.labels import ROLE_LABEL
from speculator_operator.domain.releases import supports
from speculator_operator.render import group
from speculator_operator.render.serving import (
    LAYOUT_UNSUPPORTED,
    PORT,
    RenderError,
    parallel_args,
    workload_name,
)
from speculator_operator.render.training import common
from speculator_operator.render.training.common import (
    HIDDEN_STATES,
    HS_STAGING,
    PREPARED,
    VERIFIER,
    Inputs,
    Stage,
    extraction_layers,
    labels,
    server_name,
)
from speculator_operator.render.training.data import needs_render
from speculator_operator.render.training.evaluate import evaluator_command


def extract_stage(inputs: Inputs) -> Stage | None:
    spec = inputs.spec
    if spec.hidden_states.mode != "offline" or spec.training.dry_run:
        return None
    ranks = spec.hidden_states.replicas
    command = [
        "speculators", "generate-offline-data",
        "--endpoint", f"{common.endpoint_of(inputs, 'extractor')}/v1",
        "--model", VERIFIER,
        "--preprocessed-data", PREPARED,
        "--output", HIDDEN_STATES,
        "--concurrency", str(spec.hidden_states.concurrency),
        "--validate-outputs", "--fail-on-error",
    ]  # fmt: skip
    if spec.dataset.max_samples:
        command += ["--max-samples", str(spec.dataset.max_samples)]
    if ranks > 1:
        command += ["--world-size", str(ranks), "--rank", "$(JOB_COMPLETION_INDEX)"]
    container = common.make_container(inputs.release.image("trainer"), common.wrapped("extract", command))
    job = common.make_job(inputs, "extract", spec.stages.cpu, container, completions=ranks)
    return Stage("extract", "Extracting", [job], server="extractor", command=command)


def kv_transfer_config(inputs: Inputs) -> dict[str, Any]:
    backend = inputs.spec.hidden_states.backend
    if backend == "mooncake":
        return {
            "kv_connector": "MooncakeHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_module_path": "hs_connectors.mooncake_hidden_states_connector",
            "kv_connector_extra_config": {
                "mooncake": {
                    "master_server_address": inputs.spec.hidden_states.mooncake_master,
                    "metadata_server": "P2PHANDSHAKE",
                    "protocol": "tcp",
                }
            },
        }
    config: dict[str, Any] = {
        "kv_connector": "ExampleHiddenStatesConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": HS_STAGING},
    }
    if backend == "fp8":
        config["kv_connector"] = "FP8HiddenStatesConnector"
        config["kv_connector_module_path"] = "hs_connectors.fp8_hidden_states_connector"
    return config


def _max_model_len(args: list[str]) -> int | None:
    for i, arg in enumerate(args):
        value = args[i + 1] if arg == "--max-model-len" and i + 1 < len(args) else None
        if arg.startswith("--max-model-len="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise RenderError(f"hiddenStates.extraArgs: --max-model-len {value!r} is not a number") from None
    return None


def server_args(inputs: Inputs, role: str) -> list[str]:
    """`serve MODEL FLAGS...` for the plain verifier (regenerate, render) or the extraction server."""
    vllm = inputs.release.vllm_version
    hs = inputs.spec.hidden_states
    limit = _max_model_len(hs.extra_args)
    if limit is not None and limit < inputs.spec.dataset.seq_length:
        # seen with the real tools: prepare-data asks the render endpoint to truncate at seqLength and vLLM
        # refuses every row (400), and the extraction server would refuse the longer samples
        raise RenderError(
            f"hiddenStates.extraArgs sets --max-model-len {limit}, below data.seqLength "
            f"{inputs.spec.dataset.seq_length}: the servers must take whole samples"
        )
    args = [
        "serve", VERIFIER,
        "--served-model-name", VERIFIER,  # = the trainer's --verifier-name-or-path and the clients' --model
        "--host", "0.0.0.0",  # noqa: S104 - inside the pod; the Service is the way in
        "--port", str(PORT),
        "--tensor-parallel-size", str(hs.layout.tensor),
        *parallel_args(hs.layout),
    ]  # fmt: skip
    if role == "verifier":
        if needs_render(inputs) and supports(vllm, "enable_scale_out_flag"):
            args.append("--enable-scale-out")  # the render endpoint prepare-data posts to
        return [*args, *hs.extra_args]
    if not supports(vllm, "extract_hidden_states"):
        raise RenderError(f"hidden-state extraction needs vLLM >= 0.17, the release pins {inputs.release.vllm}")
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": extraction_layers(inputs)}},
    }
    return [
        *args,
        "--speculative-config",
        json.dumps(speculative, separators=(",", ":"), sort_keys=True),
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(inputs), separators=(",", ":"), sort_keys=True),
        "--no-enable-chunked-prefill",
        *hs.extra_args,
    ]


def server(inputs: Inputs, role: str) -> list[dict[str, Any]]:
    """Deployment + Service of a vLLM server that a stage's client talks to."""
    spec = inputs.spec
    name = server_name(inputs.name, role)
    if role in ("evaluator", "sweeper-half", "sweeper-plain"):
        entrypoint = evaluator_command(inputs, role)
    else:
        entrypoint = ["speculator-operator", "vllm", "--", *server_args(inputs, role)]
    env: list[dict[str, Any]] = []
    if role == "extractor" and spec.hidden_states.backend == "mooncake":
        env.append({"name": "MOONCAKE_LOCAL_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    container = common.make_container(
        inputs.release.image("extraction"),
        entrypoint,
        env=env,
        ports=[{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        startupProbe={"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 180},
        readinessProbe={"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3},
        livenessProbe={"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
    )
    lay = spec.hidden_states.layout
    # the evaluation server serves the run's draft: the same refusals as a deployment's
    refusal = inputs.release.parallel.refusal(inputs.release.name, lay, spec.algorithm)
    if refusal:
        raise RenderError(f"hiddenStates.parallelism: {refusal}", LAYOUT_UNSUPPORTED)
    engine = container["args"]
    container["args"] = [*engine, *group.group_args(lay, group.LEADER)]
    pod = common.make_pod(inputs, role, spec.stages.server, container, lay.gpus_per_pod)
    selector = {**labels(inputs.name, role)}
    replicas = spec.hidden_states.replicas if role == "extractor" else 1
    if lay.multi_node:
        # a verifier larger than one node: one LeaderWorkerSet group per server, the Service on the leaders; every
        # rank gets the same arguments (the hidden-state connector's among them) and the same workspace mount
        meta = common.make_meta(inputs, workload_name(name, lay), role)
        pod_meta = {"labels": pod["metadata"]["labels"], "annotations": pod["metadata"].get("annotations", {})}
        worker_args = [*engine, *group.group_args(lay, group.WORKER)]
        workload = group.leader_worker_set(meta, pod_meta, pod["spec"], worker_args, lay, replicas)
        selector = {**selector, ROLE_LABEL: group.LEADER}
    else:
        workload = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": common.make_meta(inputs, name, role),
            "spec": {"replicas": replicas, "selector": {"matchLabels": selector}, "template": pod},
        }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": common.make_meta(inputs, name, role),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": PORT, "targetPort": "http"}]},
    }
    return [workload, service]
