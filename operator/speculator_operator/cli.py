"""The `speculator-operator` command line.

Exit codes: 0 success; 1 the command ran and found a problem (e.g. audit errors); 2 bad usage or
unreadable input, with one line on stderr and no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, NoReturn

from speculator_operator import __version__
from speculator_operator.commands import audit as audit_command
from speculator_operator.commands import crds as crds_command
from speculator_operator.commands import images as images_command
from speculator_operator.commands import releases as releases_command
from speculator_operator.commands import render as render_command
from speculator_operator.commands import trainer as trainer_command
from speculator_operator.commands.usage import UsageError
from speculator_operator.domain.checkpoint import CheckpointError
from speculator_operator.domain.releases import ReleaseError
from speculator_operator.render.serving import RenderError

if TYPE_CHECKING:
    from speculator_operator.runtime.settings import Settings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="speculator-operator",
        description="Train, audit, publish and serve speculative-decoding draft models for vLLM.",
    )
    parser.add_argument("--version", action="version", version=f"speculator-operator {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.add_parser("version", help="print the version")

    a = sub.add_parser(
        "audit",
        help="audit a draft checkpoint against its verifier and the pinned vLLM (header-only)",
        description="Read config.json and the safetensors headers of a speculators checkpoint (a folder, "
        "s3://bucket/prefix or hf://org/repo[@revision]) and check it against the verifier and the "
        "pinned vLLM. Exit 0: no errors; 1: errors found; 2: unreadable input or bad usage.",
    )
    a.add_argument("source", metavar="SOURCE")
    v = a.add_mutually_exclusive_group()
    v.add_argument("--verifier", metavar="SOURCE", help="the verifier (folder, s3://, hf://): its config.json")
    v.add_argument("--verifier-config", metavar="FILE", help="the verifier's config.json as a file")
    r = a.add_mutually_exclusive_group()
    r.add_argument("--release", metavar="NAME", help="pinned release to audit against (default: the default one)")
    r.add_argument("--vllm", metavar="VERSION", help="audit against the verified release that pins this vLLM")
    a.add_argument("--allow-lossy", action="store_true", help="accept lossy proposals (verifier_accept_k > 1 ...)")
    a.add_argument("--deep", action="store_true", help="also sample tensor data by ranged reads (NaN/zero checks)")
    a.add_argument(
        "--device-class",
        metavar="NAME",
        help="with a verifier: price the draft with this device class's prior (e.g. 'NVIDIA H100 80GB HBM3', cpu; "
        "default: the prior for an unknown GPU)",
    )
    a.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N", help="with a verifier: its TP size")
    a.add_argument("--format", choices=["text", "json"], default="text")

    rd = sub.add_parser(
        "render",
        help="print the children a SpeculatorDeployment or SpeculatorTrainJob would get, without a cluster",
        description="Render the Deployment (or LeaderWorkerSet), Service and PodDisruptionBudget for a "
        "SpeculatorDeployment manifest (the draft's algorithm and K are read from its checkpoint, header-only, and "
        "the draft is audited), or every stage's children of a SpeculatorTrainJob (the verifier's layer count is "
        "read from its config.json). Where the checkpoint or the verifier cannot be read (a gated hub without a "
        "token, no network, a train job's output not yet published), --draft-algorithm/--draft-tokens and "
        "--verifier-layers say what the render needs of them: the output then says, as a comment above the "
        "resource's children and on stderr, that the audit was not run and why. Other kinds (a Secret beside "
        "them) are skipped. Exit 0: rendered; 1: --strict and an audit not run or failed; 2: bad usage or "
        "unreadable input the options do not make up for.",
    )
    rd.add_argument(
        "file", metavar="FILE", nargs="+", help="manifests (YAML or JSON, several documents allowed; a folder: its "
        "*.yaml, *.yml and *.json; - for stdin)"
    )  # fmt: skip
    rd.add_argument(
        "--verifier-layers", type=int, help="train jobs: the verifier's num_hidden_layers where its config.json "
        "cannot be read"
    )  # fmt: skip
    rd.add_argument(
        "--draft-algorithm", help="deployments: the draft's speculators_model_type where its checkpoint cannot be "
        "read or is a train job's output"
    )  # fmt: skip
    rd.add_argument("--draft-tokens", type=int, help="deployments: the draft's speculative_tokens, likewise")
    rd.add_argument("--verifier-revision", help="the resolved verifier commit (default: spec.verifier.revision)")
    rd.add_argument("--namespace", default=None, help="namespace when the manifest has none (default: default)")
    rd.add_argument(
        "--strict", action="store_true", help="an unreadable checkpoint or verifier is an error even with the "
        "options above, and a failed audit exits 1"
    )  # fmt: skip
    rd.add_argument(
        "--release", metavar="NAME", help="render with this release of the table instead of the spec's, whatever "
        "its level (`speculator-operator releases`): a preview of a move; the operator refuses an Unqualified one"
    )  # fmt: skip
    rd.add_argument(
        "--image-pull-secret",
        action="append",
        default=None,
        metavar="NAME",
        help="a Secret every pod pulls its images with, as the chart's imagePullSecrets (repeatable; default: "
        "SPECULATOR_IMAGE_PULL_SECRETS, as the operator reads it)",
    )

    st = sub.add_parser(
        "stage",
        help="(in pods) copy exactly the audited files of a checkpoint from s3:// or hf:// into a folder",
        description="Exit 0: staged; 1: a file is not what was audited (named); 2: bad usage.",
    )
    st.add_argument("source")
    st.add_argument("dest")
    st.add_argument("--revision", help="the audited revision (s3 listing digest or hub commit)")
    st.add_argument("--manifest", help="the audited files as JSON [[name, etag, size(, sha256)], ...]")
    st.add_argument("--kind", choices=["draft", "verifier"], default="draft", help="which files make it up")

    sv = sub.add_parser("serve", help="(in pods) audit the staged draft, then exec vLLM with the given arguments")
    sv.add_argument("--draft", required=True)
    sv.add_argument("--verifier", required=True)
    sv.add_argument("--release", required=True)
    sv.add_argument("--allow-lossy", action="store_true")
    sv.add_argument("--verifier-revision", help="the audited verifier revision (checked against the provenance)")
    sv.add_argument("--verifier-content", help="the audited identity of the verifier files vLLM reads")
    sv.add_argument(
        "--speculate",
        action="store_true",
        help="add the speculative config the audited checkpoint calls for (--draft: a run's checkpoints)",
    )
    sv.add_argument("--num-speculative-tokens", type=int, help="K with --speculate (default: the checkpoint's)")
    sv.add_argument("--half-k", action="store_true", help="with --speculate: serve half the K, rounded up (a sweep)")
    sv.add_argument("--device-file", help="write the device and the K served here first (a sweep's server)")
    sv.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then the vLLM arguments (serve MODEL ...)")

    vl = sub.add_parser("vllm", help="(in pods) exec vLLM with the given arguments (no draft to audit)")
    vl.add_argument("--device-file", help="write the device (and K 0) here first (a sweep's plain server)")
    vl.add_argument("vllm_args", nargs=argparse.REMAINDER, help="-- then the vLLM arguments (serve MODEL ...)")

    tr = sub.add_parser("trainer", help="(in the trainer image) the stages of a SpeculatorTrainJob")
    trs = tr.add_subparsers(dest="trainer_command", metavar="STAGE", parser_class=_Parser, required=True)
    f = trs.add_parser(
        "fetch", help="stage the verifier, the s3:// / pvc:// data and a draft to convert into the workspace"
    )
    f.add_argument("--verifier", required=True)
    f.add_argument("--dest", required=True)
    f.add_argument("--revision")
    f.add_argument("--data", action="append", default=[], metavar="SOURCE=DEST")
    f.add_argument("--convert", metavar="SOURCE=DEST", help="a third-party draft to stage for speculators convert")
    f.add_argument("--convert-revision", metavar="REV", help="its hub revision")
    r2 = trs.add_parser("run", help="run a stage's tool and report its outcome")
    r2.add_argument("--stage", required=True)
    r2.add_argument("--hold-out", type=int, metavar="N", help="prepare: split N samples (seeded draw) off for evaluate")
    r2.add_argument("--held-out-file", metavar="FILE", help="prepare: where their prompts go (JSON lines)")
    r2.add_argument("tool", nargs=argparse.REMAINDER, help="-- then the command")
    ev = trs.add_parser(
        "evaluate",
        help="measure acceptance in a running vLLM (exit 3: below the bound, 4: no drafts, 5: server not ready)",
    )
    ev.add_argument("--endpoint", required=True, help="the vLLM server, http://host:port")
    ev.add_argument("--model", required=True, help="its served model name")
    ev.add_argument("--checkpoint", required=True, help="the run's checkpoint folder (for K and the cost ratio)")
    ev.add_argument("--verifier", required=True, help="the verifier's folder (for the cost ratio)")
    prompts = ev.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompts-file", help="JSON lines with prompt_token_ids or prompt")
    prompts.add_argument("--prompts-json", help="a JSON list of prompt strings")
    ev.add_argument("--max-tokens", type=int, default=64)
    ev.add_argument("--temperature", type=float, default=0.0)
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--concurrency", type=int, default=4)
    ev.add_argument("--timeout", type=float, default=1800, help="seconds for the whole evaluation")
    ev.add_argument("--k", type=int, help="K the server drafts with (default: the checkpoint's)")
    ev.add_argument("--min-acceptance", type=float)
    ev.add_argument("--min-speedup", type=float)
    sw = trs.add_parser("sweep", help="measure one server's throughput against concurrency (exit 6: a point failed)")
    sw.add_argument("--endpoint", required=True, help="the vLLM server, http://host:port")
    sw.add_argument("--model", required=True, help="its served model name")
    sw.add_argument("--checkpoint", required=True, help="the run's checkpoint folder (for K)")
    sw.add_argument("--label", required=True, choices=("k", "half", "plain"), help="which K this server serves")
    sw.add_argument("--k", type=int, help="the evaluated K (default: the checkpoint's)")
    sw.add_argument("--device-file", required=True, help="where the server's entrypoint wrote its device and K")
    prompts = sw.add_mutually_exclusive_group(required=True)
    prompts.add_argument("--prompts-file", help="JSON lines with prompt_token_ids or prompt")
    prompts.add_argument("--prompts-json", help="a JSON list of prompt strings")
    sw.add_argument("--concurrencies", required=True, help="comma-separated, e.g. 1,2,4")
    sw.add_argument("--rounds", type=int, default=2, help="requests per point: rounds × concurrency")
    sw.add_argument("--max-tokens", type=int, default=64)
    sw.add_argument("--seed", type=int, default=0)
    sw.add_argument("--timeout", type=float, default=3600, help="seconds for this server's whole sweep")
    au = trs.add_parser("audit", help="audit the trained checkpoint (exit 1: errors, 2: unreadable)")
    au.add_argument("checkpoints")
    au.add_argument("--verifier", required=True)
    au.add_argument("--release")
    pb = trs.add_parser("publish", help="publish the audited checkpoint atomically (s3://, hf://, a folder)")
    pb.add_argument("checkpoints")
    pb.add_argument("target")
    pb.add_argument("--verifier", required=True, help="the verifier's identity to record in config.json")
    pb.add_argument("--verifier-revision", required=True)
    pb.add_argument("--verifier-content", help="the identity of the verifier files vLLM reads")
    pb.add_argument("--job", required=True)
    pb.add_argument("--release", required=True)
    pb.add_argument("--uri", help="the target as the user named it (pvc://claim/path for a mounted folder)")
    pb.add_argument("--evaluation", type=json.loads, help="the evaluate stage's measure (JSON) for the record")
    pb.add_argument("--sweep", type=json.loads, help="the sweep's curve (JSON) for the record")

    rn = sub.add_parser("run", help="run the operator (kopf) against the cluster of KUBECONFIG or in-cluster")
    scope = rn.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", help="watch these namespaces (repeatable)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch the whole cluster (default)")
    rn.add_argument("--standalone", action="store_true", help="no peering with other operator instances")
    rn.add_argument("--liveness", metavar="URL", help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    rn.add_argument(
        "--leader-elect",
        action="store_true",
        help="run the controllers only while holding a coordination.k8s.io Lease (replicas wait as standbys); "
        "exits 3 when the Lease is lost",
    )
    rn.add_argument("--lease-name", default="speculator-operator", help="the Lease (default: %(default)s)")
    rn.add_argument(
        "--lease-namespace",
        default=None,
        help="the Lease's namespace (default: POD_NAMESPACE, the service account's, or default)",
    )
    rn.add_argument("--identity", default=None, help="this candidate's name in the Lease (default: POD_NAME_xxxxxx)")
    rn.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="log every handler and timer run (kopf.objects) and each status write with its cause",
    )
    rn.add_argument(
        "--skip-permission-check",
        action="store_true",
        help="start without first asking the API server whether every verb the operator uses is allowed",
    )

    im = sub.add_parser(
        "images",
        help="print the image references of a release (what hack/build-images tags and the renderers use)",
    )
    im.add_argument("--release", metavar="NAME", help="default: the default release (any level: qualification)")
    im.add_argument(
        "--build-args",
        action="store_true",
        help="print the release's pins as the Dockerfiles' build arguments (KEY=VALUE lines) instead",
    )
    im.add_argument(
        "--locked",
        metavar="ROLE",
        help="print the distributions the release's recorded evidence found in its ROLE image (trainer, server) as "
        "name==version, space-separated (nothing where none is recorded)",
    )
    releases_command.add_parser(sub)

    c = sub.add_parser("crds", help="print the CustomResourceDefinitions (or write them into a folder)")
    c.add_argument("--output-dir", metavar="DIR", help="write one YAML file per CRD here (as in crds/)")
    return parser


def _start_controllers(settings: Settings) -> None:
    """`run`'s controllers, imported once the process is set up (runtime/entry.py; the import registers their
    handlers with kopf) and handed the settings it read."""
    from speculator_operator import controllers

    controllers.start(settings)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "version":
            print(__version__)
            return 0
        if args.command == "audit":
            return audit_command.run(args)
        if args.command == "crds":
            return crds_command.run(args)
        if args.command == "images":
            return images_command.run(args)
        if args.command == "releases":
            return releases_command.run(args)
        if args.command == "render":
            return render_command.run(args)
        if args.command == "run":
            from speculator_operator.runtime.entry import run_operator

            return run_operator(args, _start_controllers)
        if args.command == "stage":
            from speculator_operator.pods.stage import stage

            return stage(args.source, args.dest, args.revision, args.manifest, args.kind)
        if args.command == "vllm":
            from speculator_operator.pods.serve import exec_vllm

            rest = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
            return exec_vllm(rest, args.device_file)
        if args.command == "trainer":
            return trainer_command.run(args)
        if args.command == "serve":
            from speculator_operator.pods.serve import serve

            rest = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
            return serve(
                args.draft,
                args.verifier,
                args.release,
                rest,
                args.allow_lossy,
                verifier_revision=args.verifier_revision,
                verifier_content=args.verifier_content,
                speculate=args.speculate,
                k=args.num_speculative_tokens,
                half_k=args.half_k,
                device_file=args.device_file,
            )
        parser.print_help(sys.stderr)
        return 2
    except (UsageError, CheckpointError, ReleaseError, RenderError, ValueError) as exc:
        print(f"speculator-operator: {exc}" if not str(exc).startswith("speculator-operator") else exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
