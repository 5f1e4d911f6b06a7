"""The train stage: the `speculators train` flags of the pinned release and the torchrun launch (one node or an
Indexed Job of N with a headless Service for the rendezvous)."""

from __future__ import annotations

from typing import Any

from speculator_operator.domain.algorithms import Algorithm, Family, in_family
from speculator_operator.domain.releases import Release
from speculator_operator.render.serving import (
    RenderError,
)
from speculator_operator.render.training import common
from speculator_operator.render.training.common import (
    CHECKPOINTS,
    HIDDEN_STATES,
    LOGS,
    PREPARED,
    RDZV_PORT,
    VERIFIER,
    Inputs,
    Stage,
    job_name,
    target_layers,
)

# Flags the operator renders for `speculators train`; training.extraArgs may not repeat them.
OWNED_TRAIN_FLAGS = frozenset({
    "--speculator-type", "--verifier-name-or-path", "--data-path", "--save-path", "--log-dir", "--epochs",
    "--total-seq-len", "--hidden-states-backend", "--hidden-states-path", "--on-missing", "--on-generate",
    "--vllm-endpoint", "--lr", "--num-layers", "--draft-arch", "--draft-vocab-size", "--block-size", "--ttt-steps",
    "--num-depths", "--num-speculative-steps", "--target-layer-ids", "--from-pretrained", "--fsdp-shard",
    "--dry-run", "--mooncake-master", "--config", "--dump-config", "--help", "--token-freq-path",
})  # fmt: skip


# `speculators train` flags of each pinned speculators version (the argparse parser's option strings;
# tests/workloads checks this list against the real parser).
_TRAIN_FLAGS_0_9_0 = """
--help --config --dump-config --speculator-type --dry-run --seed --deterministic-cuda --verifier-name-or-path
--trust-remote-code --from-pretrained --draft-config --num-layers --draft-arch --draft-hidden-act
--draft-mrope-full-head-hack --no-draft-mrope-full-head-hack --target-layer-ids --token-freq-path
--draft-vocab-size --d2t-path --t2d-path --mask-token-id --norm-before-residual --no-norm-before-residual
--embed-requires-grad --no-embed-requires-grad --norm-before-fc --no-norm-before-fc --fc-norm --norm-output
--no-norm-output --sliding-window --full-attention-indices --sliding-window-non-causal
--no-sliding-window-non-causal --draft-attn-impl --data-path --hidden-states-backend --total-seq-len
--train-data-ratio --hidden-states-dtype --num-workers --prefetch-factor --max-anchors --vllm-endpoint
--on-missing --on-generate --request-timeout --max-retries --generation-validation-retries
--max-consecutive-generation-failures --loss-implementation --loss-fn --ttt-steps --ttt-step-loss-decay
--optimizer --lr --weight-decay --muon-lr --muon-momentum --muon-weight-decay --muon-ns-steps
--muon-adjust-lr-fn --scheduler-type --scheduler-warmup-steps --scheduler-warmup-ratio --scheduler-total-steps
--scheduler-num-cosine-cycles --epochs --checkpoint-freq --save-best --no-resume-from-checkpoint --log-freq
--save-path --fsdp-shard --gradient-checkpointing --max-steps --logger --log-dir --run-name --block-size
--sample-from-anchor --no-sample-from-anchor --dflash-decay-gamma --per-position-loss-weight --dpace-alpha
--conv-kernel-size --conv-group-size --selector-rank --selector-top-k --selector-loss-alpha --markov-rank
--markov-head-type --enable-confidence-head --no-enable-confidence-head --confidence-head-with-markov
--no-confidence-head-with-markov --confidence-head-alpha --xpress-rank --xpress-mlp-ratio --num-jacobi-passes
--consistency-weight --consistency-passes --base-anchor-weight --ce-from-data --base-anchor-full-weight
--num-depths --down-sample-ratio --down-sample-ratio-min --num-speculative-steps --step-weight-beta
--hidden-states-path --mooncake-master --mooncake-metadata-server --mooncake-protocol --mooncake-device
--mooncake-global-segment-gib --mooncake-local-buffer-gib
"""


TRAIN_FLAGS: dict[str, frozenset[str]] = {"0.9.0": frozenset(_TRAIN_FLAGS_0_9_0.split())}


def check_train_args(release: Release, args: list[str]) -> None:
    """training.extraArgs: flags of the pinned speculators only, none the operator renders."""
    known = TRAIN_FLAGS.get(release.speculators)
    if known is None:
        raise RenderError(f"no train flag list for speculators {release.speculators}")
    for arg in args:
        if not arg.startswith("--"):
            continue
        flag = arg.split("=", 1)[0]
        if flag in OWNED_TRAIN_FLAGS:
            raise RenderError(f"training.extraArgs: {flag} is set by the operator (from the spec)")
        if flag not in known:
            import difflib

            close = difflib.get_close_matches(flag, sorted(known), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise RenderError(
                f"training.extraArgs: {flag} is not a flag of speculators {release.speculators} train{hint}"
            )


def train_command(inputs: Inputs) -> list[str]:
    """The `speculators train` flags (without the launcher)."""
    spec, draft = inputs.spec, inputs.spec.draft
    args = [
        "--speculator-type", spec.algorithm,
        "--verifier-name-or-path", VERIFIER,
        "--data-path", PREPARED,
        "--save-path", CHECKPOINTS,
        "--log-dir", LOGS,
        "--epochs", str(spec.training.epochs),
        "--total-seq-len", str(spec.dataset.seq_length),
        "--hidden-states-backend", spec.hidden_states.backend,
    ]  # fmt: skip
    if spec.algorithm != Algorithm.MTP.value:
        args += ["--target-layer-ids", *map(str, target_layers(inputs))]
    optional: list[tuple[str, Any]] = [
        ("--lr", spec.training.lr), ("--num-layers", draft.num_layers), ("--draft-arch", draft.draft_arch),
        ("--draft-vocab-size", draft.draft_vocab_size), ("--from-pretrained", draft.from_pretrained),
    ]  # fmt: skip
    if in_family(spec.algorithm, Family.DFLASH):
        optional.append(("--block-size", draft.block_size))
    if spec.algorithm == Algorithm.EAGLE3.value:
        optional.append(("--ttt-steps", draft.ttt_steps))
    if spec.algorithm == Algorithm.PEAGLE.value:
        optional.append(("--num-depths", draft.num_depths))
    if spec.algorithm == Algorithm.MTP.value:
        optional.append(("--num-speculative-steps", draft.num_speculative_steps))
    for flag, value in optional:
        if value is not None:
            args += [flag, str(value)]
    if spec.training.dry_run:
        args.append("--dry-run")
    elif spec.hidden_states.mode == "offline":
        args += ["--hidden-states-path", HIDDEN_STATES, "--on-missing", "raise"]
    else:
        args += ["--vllm-endpoint", f"{common.endpoint_of(inputs, 'extractor')}/v1", "--on-missing", "generate"]
    if spec.hidden_states.backend == "mooncake" and spec.hidden_states.mooncake_master:
        args += ["--mooncake-master", spec.hidden_states.mooncake_master]
    if spec.training.fsdp and not spec.training.dry_run:
        args.append("--fsdp-shard")
    check_train_args(inputs.release, spec.training.extra_args)
    return [*args, *spec.training.extra_args]


def train_stage(inputs: Inputs) -> Stage:
    spec = inputs.spec
    flags = train_command(inputs)
    nodes, gpus = spec.training.nodes, spec.training.gpus_per_node
    children: list[dict[str, Any]] = []
    subdomain = None
    if spec.training.dry_run:
        command, nodes, gpus = ["speculators", "train", *flags], 1, 0
    elif nodes == 1:
        command = ["torchrun", "--standalone", "--nproc-per-node", str(gpus), "-m", "speculators.train", *flags]
    else:
        subdomain = job_name(inputs.name, "train")
        master = f"{subdomain}-0.{subdomain}.{inputs.namespace}.svc"
        command = [
            "torchrun", "--nnodes", str(nodes), "--nproc-per-node", str(gpus),
            "--node-rank", "$(JOB_COMPLETION_INDEX)", "--master-addr", master, "--master-port", str(RDZV_PORT),
            "-m", "speculators.train", *flags,
        ]  # fmt: skip
        children.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": common.make_meta(inputs, subdomain, "train"),
                "spec": {
                    "clusterIP": "None",
                    "publishNotReadyAddresses": True,
                    "selector": {"job-name": subdomain},
                    "ports": [{"name": "rendezvous", "port": RDZV_PORT, "targetPort": RDZV_PORT}],
                },
            }
        )
    container = common.make_container(
        inputs.release.image("trainer"),
        common.wrapped("train", command),
        ports=[{"name": "rendezvous", "containerPort": RDZV_PORT}] if nodes > 1 else [],
    )
    if not container["ports"]:
        del container["ports"]
    # several nodes fail together: a restart of the group costs every node's progress, so the retry
    # budget counts pods
    job = common.make_job(
        inputs,
        "train",
        spec.stages.trainer,
        container,
        gpus=gpus,
        completions=nodes,
        retries=spec.retries * nodes,
        subdomain=subdomain,
    )
    server = "extractor" if spec.hidden_states.mode == "online" and not spec.training.dry_run else None
    return Stage("train", "Training", [job, *children], server=server, command=command)
