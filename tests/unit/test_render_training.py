"""The SpeculatorTrainJob renderer: which stages exist, and the exact commands each one runs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
from speculator_operator.domain.releases import get_release
from speculator_operator.render.serving import RenderError
from speculator_operator.render.training import (
    Inputs,
    check_train_args,
    job_name,
    render_all,
    server,
    server_args,
    stages,
    verifier_facts,
    verifier_layers,
)

BASE: dict[str, Any] = {
    "verifier": {"model": "Qwen/Qwen3-8B"},
    "algorithm": "eagle3",
    "data": {"sources": ["hf:HuggingFaceH4/ultrachat_200k"]},
    "output": {"uri": "s3://drafts/qwen3-8b"},
}


def inputs(name: str = "run", layers: int = 36, **spec: Any) -> Inputs:
    parsed = SpeculatorTrainJobSpec.model_validate({**BASE, **spec})
    return Inputs(name, "ml", parsed, get_release(), "abc123", layers, "uid-1")


def by_name(i: Inputs) -> dict[str, Any]:
    return {s.name: s for s in stages(i)}


def test_stages_follow_the_spec() -> None:
    assert list(by_name(inputs())) == ["fetch", "prepare", "extract", "train", "audit", "publish"]
    assert list(by_name(inputs(hiddenStates={"mode": "online"}))) == ["fetch", "prepare", "train", "audit", "publish"]
    regen = inputs(data={"regenerate": {"dataset": "ultrachat", "limit": 10}})
    assert list(by_name(regen))[:3] == ["fetch", "regenerate", "prepare"]
    assert list(by_name(inputs(training={"dryRun": True}))) == ["fetch", "prepare", "train", "audit", "publish"]


def test_extraction_adds_the_last_layer_and_the_trainer_does_not() -> None:
    i = inputs()
    args = server_args(i, "extractor")
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["method"] == "extract_hidden_states"
    assert config["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 18, 33, 36]
    assert args[args.index("--served-model-name") + 1] == "/workspace/verifier"
    assert "--no-enable-chunked-prefill" in args
    train = by_name(i)["train"].command
    at = train.index("--target-layer-ids")
    assert train[at + 1 : at + 4] == ["2", "18", "33"]
    assert train[at + 4].startswith("--")
    assert train[train.index("--verifier-name-or-path") + 1] == "/workspace/verifier"
    custom = inputs(draft={"targetLayerIds": [1, 10, 20]})
    args = server_args(custom, "extractor")
    assert json.loads(args[args.index("--speculative-config") + 1])["draft_model_config"]["hf_config"][
        "eagle_aux_hidden_state_layer_ids"
    ] == [1, 10, 20, 36]
    with pytest.raises(RenderError, match="outside the verifier's layers"):
        stages(inputs(draft={"targetLayerIds": [2, 40]}))


def test_mtp_extracts_only_the_last_layer() -> None:
    i = inputs(algorithm="mtp")
    args = server_args(i, "extractor")
    ids = json.loads(args[args.index("--speculative-config") + 1])["draft_model_config"]["hf_config"]
    assert ids["eagle_aux_hidden_state_layer_ids"] == [36]
    assert "--target-layer-ids" not in by_name(i)["train"].command


def test_an_mtp_head_is_stitched_into_its_verifier_and_that_is_audited_and_published() -> None:
    found = by_name(inputs(algorithm="mtp"))
    assert list(found)[-4:] == ["train", "stitch", "audit", "publish"]
    assert found["stitch"].command == [
        "speculators", "stitch-mtp", "/workspace/checkpoints", "/workspace/verifier", "--output-path",
        "/workspace/stitched",
    ]  # fmt: skip
    audit = found["audit"].command
    assert audit[3] == "/workspace/stitched"
    assert audit[audit.index("--release") + 1] == get_release().name  # served: audited against the pinned vLLM
    assert found["publish"].command[3] == "/workspace/stitched"
    assert "stitch" not in by_name(inputs())  # other drafts are published as trained


CONVERT: dict[str, Any] = {**{k: v for k, v in BASE.items() if k != "data"},
                           "convert": {"source": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "revision": "v1",
                                       "credentials": {"name": "hub"}}}  # fmt: skip


def test_a_convert_job_fetches_converts_audits_and_publishes() -> None:
    i = inputs(**{**CONVERT, "draft": {"targetLayerIds": [1, 17, 32]}, "convert": {
        **CONVERT["convert"], "normBeforeResidual": True}})  # fmt: skip
    found = by_name(i)
    assert list(found) == ["fetch", "convert", "audit", "publish"]
    fetch = found["fetch"].command
    assert fetch[fetch.index("--convert") + 1] == "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B=/workspace/convert-source"
    assert fetch[fetch.index("--convert-revision") + 1] == "v1"
    (job,) = found["fetch"].children
    env_from = job["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    assert {"secretRef": {"name": "hub"}} in env_from
    convert = found["convert"].command
    assert convert[:3] == ["speculators", "convert", "/workspace/convert-source"]
    assert convert[convert.index("--algorithm") + 1] == "eagle3"
    assert convert[convert.index("--output-path") + 1] == "/workspace/checkpoints"
    kwargs = json.loads(convert[convert.index("--algorithm-kwargs") + 1])
    assert kwargs == {"norm_before_residual": True, "eagle_aux_hidden_state_layer_ids": [1, 17, 32]}
    assert found["audit"].command[3] == "/workspace/checkpoints"
    assert not any(s.server for s in found.values())  # no vLLM server: nothing to regenerate or extract


def test_convert_kwargs_follow_the_algorithm() -> None:
    dflash = by_name(inputs(**{**CONVERT, "algorithm": "dflash", "draft": {"targetLayerIds": [2, 5]}}))["convert"]
    assert json.loads(dflash.command[-1]) == {"aux_hidden_state_layer_ids": [2, 5]}
    plain = by_name(inputs(**{**CONVERT, "algorithm": "dflash"}))["convert"]
    assert "--algorithm-kwargs" not in plain.command
    mtp = by_name(inputs(**{**CONVERT, "algorithm": "mtp", "draft": {"numSpeculativeSteps": 2}}))
    assert json.loads(mtp["convert"].command[-1]) == {"num_speculative_steps": 2}
    assert list(mtp) == ["fetch", "convert", "stitch", "audit", "publish"]


def test_a_pvc_source_is_mounted_and_copied() -> None:
    i = inputs(**{**CONVERT, "convert": {"source": "pvc://drafts/eagle3/v2"}})
    fetch = by_name(i)["fetch"]
    command = fetch.command
    assert command[command.index("--convert") + 1] == "/mnt/sources/drafts/eagle3/v2=/workspace/convert-source"
    pod = fetch.children[0]["spec"]["template"]["spec"]
    assert {"name": "src0", "persistentVolumeClaim": {"claimName": "drafts", "readOnly": True}} in pod["volumes"]


def test_prepare_data_keeps_token_frequencies_when_the_vocabulary_is_reduced() -> None:
    plain = by_name(inputs())["prepare"].command
    assert "--no-skip-token-freq" not in plain
    assert plain[plain.index("--render-endpoint") + 1] == "http://run-verifier.ml.svc:8000"
    reduced = by_name(inputs(draft={"draftVocabSize": 32000}))["prepare"].command
    assert "--no-skip-token-freq" in reduced
    pretok = inputs(data={"sources": ["s3://data/rows.jsonl"], "format": "pretokenized", "maxSamples": 50})
    stage = by_name(pretok)["prepare"]
    assert stage.server is None
    assert "--render-endpoint" not in stage.command
    assert stage.command[stage.command.index("--data") + 1] == "/workspace/sources/0/rows.jsonl"
    assert stage.command[stage.command.index("--max-samples") + 1] == "50"
    fetch = by_name(pretok)["fetch"].command
    assert "s3://data/rows.jsonl=/workspace/sources/0/rows.jsonl" in fetch
    assert fetch[fetch.index("--revision") + 1] == "abc123"


def test_regenerated_data_needs_no_render_endpoint() -> None:
    i = inputs(data={"regenerate": {"dataset": "gsm8k", "limit": 100, "samplingParams": {"temperature": 0.6}}})
    st = by_name(i)
    assert st["regenerate"].server == "verifier"
    cmd = st["regenerate"].command
    assert cmd[cmd.index("--endpoint") + 1] == "http://run-verifier.ml.svc:8000/v1/chat/completions"
    assert cmd[cmd.index("--sampling-params") + 1] == '{"temperature":0.6}'
    prep = st["prepare"]
    assert prep.server is None
    assert prep.command[prep.command.index("--data") + 1].endswith("regenerated/data.jsonl")
    assert "--enable-scale-out" not in server_args(i, "verifier")
    assert "--enable-scale-out" in server_args(inputs(), "verifier")  # conversations: the render endpoint


def test_offline_and_online_training() -> None:
    offline = by_name(inputs())["train"].command
    assert offline[:3] == ["torchrun", "--standalone", "--nproc-per-node"]
    assert offline[offline.index("--on-missing") + 1] == "raise"
    assert offline[offline.index("--hidden-states-path") + 1] == "/workspace/hidden_states"
    online = by_name(inputs(hiddenStates={"mode": "online"}))["train"]
    assert online.server == "extractor"
    assert online.command[online.command.index("--on-missing") + 1] == "generate"
    assert online.command[online.command.index("--vllm-endpoint") + 1] == "http://run-extractor.ml.svc:8000/v1"
    dry = by_name(inputs(training={"dryRun": True}))["train"]
    assert dry.command[:2] == ["speculators", "train"]
    assert "--dry-run" in dry.command
    pod = dry.children[0]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"].get("limits", {})


def test_several_nodes_get_an_indexed_job_and_a_headless_service() -> None:
    st = by_name(inputs(training={"nodes": 4, "gpusPerNode": 8}, workspace={"accessMode": "ReadWriteMany"}))["train"]
    job, svc = st.children
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == 4
    assert job["spec"]["backoffLimit"] == 8  # retries (2) per node
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"] == "run-train"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    cmd = st.command
    assert cmd[cmd.index("--master-addr") + 1] == "run-train-0.run-train.ml.svc"
    assert cmd[cmd.index("--node-rank") + 1] == "$(JOB_COMPLETION_INDEX)"


def test_train_flags_are_checked_against_the_pinned_speculators() -> None:
    release = get_release()
    check_train_args(release, ["--save-best", "--checkpoint-freq", "2", "--loss-fn=ce"])
    with pytest.raises(RenderError, match="did you mean --save-best"):
        check_train_args(release, ["--save-bets"])
    with pytest.raises(RenderError, match="--epochs is set by the operator"):
        check_train_args(release, ["--epochs", "9"])
    with pytest.raises(RenderError, match=r"not a flag of speculators 0\.9\.0"):
        stages(inputs(training={"extraArgs": ["--on-generate-cache"]}))


def test_backends_render_their_connector() -> None:
    def kv(**hs: Any) -> dict[str, Any]:
        args = server_args(inputs(hiddenStates=hs), "extractor")
        return json.loads(args[args.index("--kv-transfer-config") + 1])  # type: ignore[no-any-return]

    assert kv()["kv_connector"] == "ExampleHiddenStatesConnector"
    assert kv()["kv_connector_extra_config"]["shared_storage_path"] == "/workspace/hs-staging"
    assert kv(backend="fp8")["kv_connector_module_path"] == "hs_connectors.fp8_hidden_states_connector"
    moon = inputs(hiddenStates={"mode": "online", "backend": "mooncake", "mooncakeMaster": "mc:50051"})
    dep, _ = server(moon, "extractor")
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "MOONCAKE_LOCAL_HOSTNAME", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in env
    train = by_name(moon)["train"].command
    assert train[train.index("--mooncake-master") + 1] == "mc:50051"


def test_children_are_owned_named_and_mount_one_workspace() -> None:
    children = render_all(inputs(stages={"cpu": {"labels": {"team": "ml"}}}))
    kinds = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert kinds[0] == ("PersistentVolumeClaim", "run-workspace")
    assert ("Deployment", "run-verifier") in kinds
    assert ("Deployment", "run-extractor") in kinds
    for c in children:
        assert c["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        if c["kind"] in ("Job", "Deployment"):
            pod = c["spec"]["template"]
            assert pod["spec"]["enableServiceLinks"] is False
            mounts = pod["spec"]["containers"][0]["volumeMounts"]
            assert {"name": "workspace", "mountPath": "/workspace"} in mounts
    fetch = next(c for c in children if c["metadata"]["name"] == "run-fetch")
    assert fetch["spec"]["template"]["metadata"]["labels"]["team"] == "ml"
    own = render_all(inputs(workspace={"claimName": "shared"}))
    assert own[0]["kind"] != "PersistentVolumeClaim"


def test_servers_must_take_whole_samples() -> None:
    ok = inputs(data={"sources": ["hf:o/d"], "seqLength": 4096},
                hiddenStates={"extraArgs": ["--max-model-len", "8192"]})  # fmt: skip
    assert "--max-model-len" in server_args(ok, "verifier")
    short = inputs(data={"sources": ["hf:o/d"], "seqLength": 8192}, hiddenStates={"extraArgs": ["--max-model-len=512"]})
    with pytest.raises(RenderError, match=r"below data\.seqLength 8192"):
        server_args(short, "extractor")


def test_long_names_stay_valid_and_stable() -> None:
    name = "a" * 63
    assert len(job_name(name, "publish")) <= 52
    assert job_name(name, "publish") == job_name(name, "publish") != job_name(name, "prepare")


def test_publish_to_a_claim_mounts_it() -> None:
    job = by_name(inputs(output={"uri": "pvc://drafts/qwen/v1"}))["publish"].children[0]
    pod = job["spec"]["template"]["spec"]
    assert {"name": "output", "persistentVolumeClaim": {"claimName": "drafts"}} in pod["volumes"]
    assert pod["containers"][0]["args"][2:4] == ["/workspace/checkpoints", "/output/qwen/v1"]


def test_verifier_facts_come_from_the_config() -> None:
    assert verifier_facts({"model_type": "qwen3", "num_hidden_layers": 36, "max_position_embeddings": 40960}) == (
        36, "qwen3", 40960)  # fmt: skip
    stretched = {"num_hidden_layers": 8, "max_position_embeddings": 4096, "rope_scaling": {"factor": 4.0}}
    assert verifier_facts(stretched) == (8, None, None)
    nested = {"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 4}}
    assert verifier_facts(nested) == (4, "qwen3_5_text", None)


def test_verifier_layers_come_from_the_config() -> None:
    assert verifier_layers({"num_hidden_layers": 36}) == 36
    assert verifier_layers({"text_config": {"num_hidden_layers": 48}, "num_hidden_layers": 2}) == 48
    with pytest.raises(RenderError):
        verifier_layers({"num_hidden_layers": True})


def test_an_evaluated_job_holds_out_samples_and_gates_the_publish_on_its_own_server() -> None:
    i = inputs(
        evaluation={
            "minAcceptance": 0.6,
            "minSpeedup": 1.3,
            "heldOut": 32,
            "timeoutSeconds": 900,
            "numSpeculativeTokens": 4,
        },
        hiddenStates={"extraArgs": ["--max-model-len", "4096"]},
    )
    found = by_name(i)
    assert list(found) == ["fetch", "prepare", "extract", "train", "audit", "evaluate", "publish"]
    prepare = found["prepare"].children[0]["spec"]["template"]["spec"]["containers"][0]
    # split off after prepare-data, before extraction and training see the rows
    assert [prepare["command"][0], *prepare["args"][:8]] == [
        "speculator-operator", "trainer", "run", "--stage", "prepare", "--hold-out", "32", "--held-out-file",
        "/workspace/held-out/prompts.jsonl",
    ]  # fmt: skip
    assert prepare["args"][8:10] == ["--", "speculators"]
    ev = found["evaluate"]
    assert ev.server == "evaluator"
    assert ev.phase == "Evaluating"
    job = ev.children[0]
    assert job["spec"]["activeDeadlineSeconds"] == 900
    codes = job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"]
    assert codes == [2, 3, 4, 5]  # a verdict is not retried
    cmd = ev.command
    assert cmd[cmd.index("--endpoint") + 1] == "http://run-evaluator.ml.svc:8000"
    assert cmd[cmd.index("--prompts-file") + 1] == "/workspace/held-out/prompts.jsonl"
    assert cmd[cmd.index("--temperature") + 1] == "0.0"  # greedy unless the spec says otherwise
    assert (cmd[cmd.index("--min-acceptance") + 1], cmd[cmd.index("--min-speedup") + 1]) == ("0.6", "1.3")
    assert cmd[cmd.index("--k") + 1] == "4"
    dep, svc = server(i, "evaluator")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    argv = [*c["command"], *c["args"]]
    # the pod builds the speculative config from the checkpoint training wrote, after auditing it there
    assert argv[: argv.index("--")] == [
        "speculator-operator", "serve", "--draft", "/workspace/checkpoints", "--verifier", "/workspace/verifier",
        "--release", get_release().name, "--speculate", "--num-speculative-tokens", "4",
    ]  # fmt: skip
    vllm = argv[argv.index("--") + 1 :]
    assert vllm[:4] == ["serve", "/workspace/verifier", "--served-model-name", "/workspace/verifier"]
    assert vllm[-2:] == ["--max-model-len", "4096"]
    assert "--speculative-config" not in vllm
    assert svc["metadata"]["name"] == "run-evaluator"


def test_an_evaluated_mtp_job_serves_the_stitched_model_and_a_convert_job_sends_the_specs_prompts() -> None:
    mtp = inputs(algorithm="mtp", evaluation={})
    dep, _ = server(mtp, "evaluator")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    argv = [*c["command"], *c["args"]]
    assert argv[argv.index("--draft") + 1] == "/workspace/stitched"
    assert argv[argv.index("--") + 1 : argv.index("--") + 3] == ["serve", "/workspace/stitched"]
    assert list(by_name(mtp))[-3:] == ["audit", "evaluate", "publish"]
    spec = {k: v for k, v in BASE.items() if k != "data"}
    converted = Inputs("c", "ml", SpeculatorTrainJobSpec.model_validate({
        **spec, "convert": {"source": "hf://org/eagle3"}, "evaluation": {"prompts": ["Hello", "Write a haiku"]},
    }), get_release(), "abc123", 36, "uid-1")  # fmt: skip
    found = by_name(converted)
    assert list(found) == ["fetch", "convert", "audit", "evaluate", "publish"]
    cmd = found["evaluate"].command
    assert json.loads(cmd[cmd.index("--prompts-json") + 1]) == ["Hello", "Write a haiku"]
    assert "--prompts-file" not in cmd
    assert "--min-acceptance" not in cmd  # no bound: measured and recorded only


def test_an_unevaluated_job_has_no_evaluate_stage_and_no_split() -> None:
    found = by_name(inputs())
    assert "evaluate" not in found
    prepare = found["prepare"].children[0]["spec"]["template"]["spec"]["containers"][0]
    assert "--hold-out" not in prepare["args"]


def test_a_stage_groups_image_and_env_are_the_specs_where_it_names_them() -> None:
    cpu = get_release().image("server", "cpu")
    i = inputs(evaluation={}, stages={"server": {"image": cpu, "env": [{"name": "OMP_NUM_THREADS", "value": "2"}],
                                                 "resources": {"limits": {"nvidia.com/gpu": 0}}}})  # fmt: skip
    dep, _ = server(i, "evaluator")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == cpu
    assert {"name": "OMP_NUM_THREADS", "value": "2"} in c["env"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 0  # a CPU node: no GPU asked for
    job = by_name(i)["evaluate"].children[0]
    (client,) = job["spec"]["template"]["spec"]["containers"]
    assert client["image"] == get_release().image("trainer")  # the cpu stages keep the release's trainer image
