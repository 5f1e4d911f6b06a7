"""The `speculator-operator` command line.

Exit codes: 0 success; 1 the command ran and found a problem (e.g. audit errors); 2 bad usage or
unreadable input, with one line on stderr and no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from speculator_operator import __version__
from speculator_operator.adapters.checkpoints import audit, load_verifier_config, read_verifier
from speculator_operator.api.common import GROUP as API_GROUP
from speculator_operator.commands import releases as releases_command
from speculator_operator.domain.algorithms import Algorithm
from speculator_operator.domain.checkpoint import AuditReport, CheckpointError, VerifierRef
from speculator_operator.domain.economics import break_even_alpha, draft_forwards
from speculator_operator.domain.priors import pair_load, pair_size, prior
from speculator_operator.domain.releases import Release, ReleaseError, get_release, release_for, release_row
from speculator_operator.domain.sweep import device_class
from speculator_operator.render.serving import RenderError


class UsageError(Exception):
    pass


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
    releases_command.add_parser(sub)

    c = sub.add_parser("crds", help="print the CustomResourceDefinitions (or write them into a folder)")
    c.add_argument("--output-dir", metavar="DIR", help="write one YAML file per CRD here (as in crds/)")
    return parser


def _crds(args: argparse.Namespace) -> int:
    from pathlib import Path

    import yaml

    from speculator_operator.api.crds import all_crds

    docs = all_crds()
    if args.output_dir:
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        for name, crd in docs.items():
            (out / name).write_text(render_yaml(crd))
            print(f"wrote {out / name}", file=sys.stderr)
    else:
        print("---\n".join(yaml.safe_dump(crd, sort_keys=False) for crd in docs.values()), end="")
    return 0


def _images(args: argparse.Namespace) -> int:
    from speculator_operator.domain.releases import operator_reference

    # by tag: what hack/build-images tags and pushes (the pods run them pinned to the pushed digests); any row of the
    # table, whatever its level: an unqualified release's images are what hack/qualify-release checks
    release = release_row(args.release) if args.release else get_release()
    if args.build_args:
        for key, value in (("SPECULATOR_RELEASE", release.name), ("VLLM_VERSION", release.vllm),
                           ("TORCH_VERSION", release.torch), ("TRANSFORMERS_VERSION", release.transformers),
                           ("SPECULATORS_VERSION", release.speculators),
                           ("HS_CONNECTORS_VERSION", release.hs_connectors)):  # fmt: skip
            print(f"{key}={value}")
        return 0
    print(f"operator {operator_reference()}")
    print(f"trainer {release.reference('trainer')}")
    print(f"server {release.reference('server')}")
    print(f"server-cpu {release.reference('server', 'cpu')}")
    return 0


@dataclass(frozen=True)
class RenderOptions:
    """What `render` is told on the command line besides the manifests."""

    verifier_layers: int | None = None  # where the verifier's config.json cannot be read
    draft_algorithm: str | None = None  # where the draft's checkpoint cannot be read (or is a train job's output)
    draft_tokens: int | None = None
    verifier_revision: str | None = None
    namespace: str | None = None
    strict: bool = False  # an unread checkpoint or verifier, or a failed audit, is an error
    pull_secrets: tuple[str, ...] = ()  # the Secrets every rendered pod pulls its images with
    release: str | None = None  # render with this release instead of the spec's (any level of the table)


@dataclass
class Rendered:
    """One resource's children, what the output says about them (`audit not run: ...`, as YAML comments on top of
    its children), and the renderer's own notes (stderr only)."""

    kind: str
    name: str
    children: list[dict[str, Any]]
    said: list[str] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)


def _render(args: argparse.Namespace) -> int:
    import yaml

    docs: list[tuple[str, Any]] = []
    for path in _manifest_files(args.file):
        text = sys.stdin.read() if path == "-" else _read_text(path)
        try:
            docs += [(path, d) for d in yaml.safe_load_all(text) if d]
        except yaml.YAMLError as exc:
            raise UsageError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    options = RenderOptions(
        verifier_layers=args.verifier_layers,
        draft_algorithm=args.draft_algorithm,
        draft_tokens=args.draft_tokens,
        verifier_revision=args.verifier_revision,
        namespace=args.namespace,
        strict=args.strict,
        pull_secrets=_pull_secrets(args),
        release=args.release,
    )
    rendered = render_documents(docs, options)
    for r in rendered:
        for line in r.said:
            print(f"# {r.name}: {line}", file=sys.stderr)
        for reason, message in r.notes:
            print(f"# {r.name}: {reason}: {message}", file=sys.stderr)
    print(format_rendered(rendered), end="")
    if options.strict and any(r.said for r in rendered):
        return 1
    return 0


def _manifest_files(given: list[str]) -> list[str]:
    """The files named, a folder standing for its *.yaml, *.yml and *.json files (sorted)."""
    from pathlib import Path

    out: list[str] = []
    for name in given:
        path = Path(name)
        if name != "-" and path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
            if not found:
                raise UsageError(f"{name}: no .yaml, .yml or .json files")
            out += [str(p) for p in found]
        else:
            out.append(name)
    return out


def render_documents(
    docs: list[tuple[str, Any]],
    options: RenderOptions,
    audit_draft: Callable[..., AuditReport] | None = None,
    read_config: Callable[[str], VerifierRef] | None = None,
) -> list[Rendered]:
    """The children of every SpeculatorDeployment and SpeculatorTrainJob among `docs` ((file, document) pairs),
    in order; other Kubernetes objects (a Secret beside them) are skipped. A draft checkpoint or verifier that
    cannot be read is not an error where the options say what the render needs of it: the children are rendered
    from the options and say that the audit was not run, and why (unless options.strict). `audit_draft` and
    `read_config` stand in for the readers (tests, snapshots)."""
    audit_draft = audit_draft or audit
    read_config = read_config or read_verifier
    out: list[Rendered] = []
    # where each train job among the inputs publishes: a deployment that serves one (fromTrainJob) stages it from there
    outputs = {
        ((d.get("metadata") or {}).get("name"), (d.get("metadata") or {}).get("namespace")): str(
            ((d.get("spec") or {}).get("output") or {}).get("uri") or ""
        )
        for _, d in docs
        if isinstance(d, dict) and d.get("kind") == "SpeculatorTrainJob"
    }
    for where, doc in docs:
        kind = doc.get("kind") if isinstance(doc, dict) else doc
        if kind == "SpeculatorTrainJob":
            out.append(_render_trainjob(where, doc, options, read_config))
        elif kind == "SpeculatorDeployment":
            out.append(_render_deployment(where, doc, options, audit_draft, outputs))
        elif (
            isinstance(doc, dict) and isinstance(kind, str) and not str(doc.get("apiVersion", "")).startswith(API_GROUP)
        ):
            name = (doc.get("metadata") or {}).get("name", "")
            print(f"# skipped {kind}/{name} ({where}): not a speculators.dev kind", file=sys.stderr)
        else:
            raise UsageError(f"{where}: expected kind SpeculatorDeployment or SpeculatorTrainJob, got {kind!r}")
    if not out:
        raise UsageError(f"{', '.join(sorted({w for w, _ in docs})) or 'input'}: no SpeculatorDeployment or "
                         "SpeculatorTrainJob to render")  # fmt: skip
    return out


def format_rendered(rendered: list[Rendered]) -> str:
    """The children as YAML documents; what a resource's render says comes first as comments."""
    import yaml

    chunks = []
    for r in rendered:
        said = "".join(f"# {r.kind}/{r.name}: {line}\n" for line in r.said)
        for i, child in enumerate(r.children):
            chunks.append((said if i == 0 else "") + yaml.safe_dump(child, sort_keys=False, width=120))
    return "---\n".join(chunks)


def _not_run(options: RenderOptions, reason: str, fallback: str) -> None:
    """An unread input where the options make up for it; --strict refuses it."""
    if options.strict:
        raise UsageError(f"{reason} (--strict: {fallback} is not enough)")


def _render_deployment(
    where: str,
    doc: dict[str, Any],
    options: RenderOptions,
    audit_draft: Callable[..., AuditReport],
    outputs: dict[tuple[Any, Any], str],
) -> Rendered:
    from pydantic import ValidationError

    from speculator_operator.api.deployment import SpeculatorDeploymentSpec
    from speculator_operator.render.serving import Draft, Inputs, draft_of, render

    meta = doc.get("metadata") or {}
    try:
        spec = SpeculatorDeploymentSpec.model_validate(doc.get("spec") or {})
    except ValidationError as exc:
        raise _spec_error(where, exc) from None
    name = meta.get("name") or "unnamed"
    release = _release_of(spec.release, options)
    # what the render needs of a draft it cannot read: the flags, else what the spec declares of it
    declared: tuple[str | None, int | None] = (spec.speculator.algorithm, spec.speculator.speculative_tokens)
    algorithm, tokens = declared
    given = f"spec.speculator.algorithm {algorithm} and speculativeTokens {tokens} as declared"
    if options.draft_algorithm and options.draft_tokens:
        algorithm, tokens = options.draft_algorithm, options.draft_tokens
        given = f"--draft-algorithm {algorithm} --draft-tokens {tokens}"
    fallback: Draft | None = None
    if algorithm and tokens:
        # a declared mtp draft is a head stitched into its verifier: the only way vLLM serves one
        fallback = Draft(algorithm, tokens, stitched=algorithm == Algorithm.MTP)
    said: list[str] = []
    source = None
    if spec.speculator.source:
        try:
            report = audit_draft(
                spec.speculator.source, release=release, allow_lossy=spec.audit.allow_lossy, declared=declared
            )
        except CheckpointError as exc:
            if fallback is None:
                raise UsageError(f"audit not run: {exc}; declare spec.speculator.algorithm and speculativeTokens "
                                 "(or pass --draft-algorithm and --draft-tokens) to render without the "
                                 "checkpoint") from None  # fmt: skip
            _not_run(options, f"audit not run: {exc}", given)
            said.append(f"audit not run: the draft could not be read ({exc}). Rendered from {given}, without "
                        "the audited file list; the operator audits the draft before it creates any pod.")  # fmt: skip
            draft = fallback
        else:
            ck = report.checkpoint
            try:
                draft = draft_of(ck)  # a stitched MTP model is served as its own verifier (method mtp)
            except RenderError:
                raise UsageError(f"{spec.speculator.source}: no speculators_model_type / speculative_tokens") from None
            source = ck.uri if ck.resolved_from else None
            if report.errors:
                first = report.errors[0]
                said.append(f"audit failed: {len(report.errors)} error(s), the first {first.rule}: {first.message}. "
                            "The operator would not deploy this draft (Audited=False, AuditFailed).")  # fmt: skip
    else:
        job = spec.speculator.from_train_job
        source = outputs.get((job, meta.get("namespace")))
        missing = [] if source else [f"train job {job}'s manifest beside it (where it publishes)"]
        if fallback is None:
            missing.append("spec.speculator.algorithm and speculativeTokens declared (or --draft-algorithm and "
                           "--draft-tokens)")  # fmt: skip
        if missing:
            raise UsageError(f"speculator.fromTrainJob: a deployment of a train job's output renders with "
                             f"{' and '.join(missing)}")  # fmt: skip
        _not_run(options, f"audit not run: the draft is train job {job}'s output", given)
        said.append(f"audit not run: the draft is train job {job}'s output, audited once it is published. "
                    f"Rendered from {given}, staged from its output.uri {source} (the operator serves the "
                    "exact folder the job published there).")  # fmt: skip
        assert fallback is not None
        draft = fallback
    namespace = meta.get("namespace") or options.namespace or "default"
    inputs = Inputs(name, namespace, spec, release, draft, options.verifier_revision, draft_source=source,
                    pull_secrets=options.pull_secrets)  # fmt: skip
    result = render(inputs)
    return Rendered("SpeculatorDeployment", name, result.children, said, list(result.notes))


def _release_of(named: str | None, options: RenderOptions) -> Release:
    """--release (any row of the table: a preview of what a release would render), else the spec's."""
    return release_row(options.release) if options.release else get_release(named)


def _spec_error(file: str, exc: Any) -> UsageError:
    first = exc.errors()[0]
    return UsageError(f"{file}: spec.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")


def _render_trainjob(
    where: str, doc: dict[str, Any], options: RenderOptions, read_config: Callable[[str], VerifierRef]
) -> Rendered:
    from pydantic import ValidationError

    from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
    from speculator_operator.render.training import Inputs, render_all, verifier_layers

    meta = doc.get("metadata") or {}
    try:
        spec = SpeculatorTrainJobSpec.model_validate(doc.get("spec") or {})
    except ValidationError as exc:
        raise _spec_error(where, exc) from None
    name = meta.get("name") or "unnamed"
    release = _release_of(spec.release, options)
    revision = options.verifier_revision
    # what the render needs of a verifier it cannot read: the flag, else what the spec declares of it
    layers = options.verifier_layers or spec.verifier.num_hidden_layers
    given = (f"--verifier-layers {layers}" if options.verifier_layers
             else f"spec.verifier.numHiddenLayers {layers} as declared")  # fmt: skip
    content = None
    said: list[str] = []
    location = spec.verifier.config_location
    if location is None:
        if layers is None:
            raise UsageError("a pvc:// verifier cannot be read here: declare spec.verifier.numHiddenLayers "
                             "(or pass --verifier-layers)")  # fmt: skip
    else:
        try:
            ref = read_config(location)
        except CheckpointError as exc:
            if layers is None:
                raise UsageError(f"{exc}: declare spec.verifier.numHiddenLayers (or pass --verifier-layers) to "
                                 "render without the verifier's config.json") from None  # fmt: skip
            _not_run(options, f"verifier not read: {exc}", given)
            said.append(f"verifier not read ({exc}): rendered with {given}"
                        + ("" if revision else "; its revision is not resolved (the operator pins it to a commit "
                           "before any stage runs)") + ".")  # fmt: skip
        else:
            layers, revision, content = verifier_layers(ref.config), revision or ref.revision, ref.content
            declared = spec.verifier.num_hidden_layers
            if declared is not None and declared != layers:
                said.append(f"verifier.numHiddenLayers is {declared} but its config.json has num_hidden_layers "
                            f"{layers}: the operator would stop this job (Failed, InvalidSpec).")  # fmt: skip
    assert layers is not None
    namespace = meta.get("namespace") or options.namespace or "default"
    inputs = Inputs(name, namespace, spec, release, revision, layers, verifier_content=content,
                    pull_secrets=options.pull_secrets)  # fmt: skip
    children = render_all(inputs)
    return Rendered("SpeculatorTrainJob", name, children, said)


def _pull_secrets(args: argparse.Namespace) -> tuple[str, ...]:
    """--image-pull-secret, else the operator's own setting (SPECULATOR_IMAGE_PULL_SECRETS), checked alike."""
    from speculator_operator.runtime.settings import PULL_SECRETS_ENV, Settings, SettingsError

    environ = {PULL_SECRETS_ENV: ",".join(args.image_pull_secret)} if args.image_pull_secret else os.environ
    try:
        return Settings.from_env(environ).image_pull_secrets
    except SettingsError as exc:
        raise UsageError(str(exc)) from None


def _read_text(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None


def render_yaml(doc: Any) -> str:
    import yaml

    return "# Generated by `speculator-operator crds` from operator/speculator_operator/api; do not edit.\n" + (
        yaml.safe_dump(doc, sort_keys=False, width=120)
    )


def _economics(
    report: AuditReport, verifier: dict[str, Any] | None, device: str | None = None, tensor_parallel: int = 1
) -> dict[str, Any] | None:
    # the planner's status shape, imported here: the in-pod sub-commands load this module in environments that hold
    # only the trainer's requirements (the planners pull in the operator's own, prometheus_client among them)
    from speculator_operator.planning.deployment import load_status

    ck = report.checkpoint
    if verifier is None or ck.speculative_tokens is None or ck.algorithm is None:
        return None
    size = pair_size({n: t.shape for n, t in ck.tensors.items()}, verifier)
    if size is None:
        return None
    k = ck.speculative_tokens
    cls = device_class(device) if device else None
    p = prior(size, cls, ck.algorithm, k, tensor_parallel)
    load = pair_load(size, cls, tensor_parallel)
    n = draft_forwards(ck.algorithm, k)
    alpha = break_even_alpha(k, p.cost_ratio, n)
    return {
        "cost_ratio": round(p.cost_ratio, 6),
        "cost_source": "prior",
        "prior": p.key,
        "parameter_ratio": round(size.parameter_ratio, 6),
        "draft_forwards_per_step": n,
        "break_even_acceptance": None if alpha is None else round(alpha, 4),
        # what prices a schedule under load: the prior row's load model (status.economics.loadModel), or None where
        # the saturation model does (a CPU: serving.tuning.saturationTokens)
        "load_model": None if load is None else load_status(load).model_dump(mode="json"),
    }


def _audit(args: argparse.Namespace) -> int:
    release = get_release(args.release) if not args.vllm else release_for(vllm=args.vllm)
    verifier = None
    ref = None
    served = None
    if args.verifier:
        ref = read_verifier(args.verifier)
        verifier, served = ref.config, args.verifier
    elif args.verifier_config:
        verifier, _ = load_verifier_config(args.verifier_config)
    report = audit(
        args.source,
        verifier=verifier,
        verifier_revision=None if ref is None else ref.revision,
        verifier_content=None if ref is None else ref.content,
        served_verifier=served,
        release=release,
        allow_lossy=args.allow_lossy,
        deep=args.deep,
    )
    econ = _economics(report, verifier, args.device_class, args.tensor_parallel_size)
    if econ:
        report.extra["economics"] = econ
    if args.format == "json":
        print(json.dumps(report.as_dict(), indent=2))
    else:
        _print_text(report)
    return 0 if report.ok else 1


def _print_text(report: AuditReport) -> None:
    s = report.checkpoint.summary()
    print(f"checkpoint  {s['uri']}" + (f" @ {s['revision']}" if s["revision"] else ""))
    if s["stitched_mtp"]:
        stitched = s["stitched_mtp"]
        print(f"            stitched MTP model: {stitched['model_type']}, {stitched['mtp_layers']} MTP layer(s)")
    else:
        print(
            f"            {s['algorithm']} (speculators {s['speculators_version']}), hidden {s['hidden_size']}, "
            f"vocab {s['draft_vocab_size']}/{s['verifier_vocab_size']}, aux layers {s['aux_layer_ids']}, "
            f"K={s['speculative_tokens']}, verifier {s['recorded_verifier']}"
        )
    if report.release is not None:
        print(f"release     {report.release.name} (speculators {report.release.speculators}, vLLM {report.vllm})")
    econ = report.extra.get("economics")
    if econ:
        print(
            f"economics   cost ratio c={econ['cost_ratio']} (prior {econ['prior']}; parameter ratio "
            f"{econ['parameter_ratio']}), break-even acceptance {econ['break_even_acceptance']} at "
            f"K={s['speculative_tokens']}"
        )
        load = econ.get("load_model")
        if load:
            print(
                f"under load  {econ['prior']} load model: verifier step {load['verifier_fixed_ms']:.3g} ms "
                f"+ {load['verifier_token_ms']:.3g} ms a token + {load['verifier_request_ms']:.3g} ms a request; "
                f"draft forward {load['draft_fixed_ms']:.3g} ms + {load['draft_token_ms']:.3g} ms a token + "
                f"{load['draft_request_ms']:.3g} ms a request"
            )
        else:
            print("under load  saturation model (serving.tuning.saturationTokens)")
    for f in report.findings:
        print(f"{f.severity.upper():8} {f.rule:22} {f.message}")
    errors = len(report.errors)
    warnings = sum(1 for f in report.findings if f.severity == "warning")
    verdict = "OK" if report.ok else "FAILED"
    print(
        f"result      {verdict}: {errors} error(s), {warnings} warning(s); read {s['bytes_read']:,} of "
        f"{s['bytes_on_disk']:,} bytes in {s['requests']} request(s), {report.seconds * 1000:.1f} ms"
    )


def _trainer(args: argparse.Namespace) -> int:
    from speculator_operator.pods import trainer

    if args.trainer_command == "fetch":
        return trainer.fetch(args.verifier, args.dest, args.revision, args.data, args.convert, args.convert_revision)
    if args.trainer_command == "run":
        held_out = (args.hold_out, args.held_out_file) if args.hold_out else None
        return trainer.run(args.stage, args.tool[1:] if args.tool[:1] == ["--"] else args.tool, held_out)
    if args.trainer_command == "evaluate":
        from speculator_operator.pods import evaluate as evaluation

        return evaluation.main(args)
    if args.trainer_command == "sweep":
        from speculator_operator.pods import sweep

        return sweep.main(args)
    if args.trainer_command == "audit":
        return trainer.audit_checkpoint(args.checkpoints, args.verifier, args.release)
    return trainer.publish(
        args.checkpoints,
        args.target,
        args.verifier,
        args.verifier_revision,
        args.job,
        args.release,
        verifier_content=args.verifier_content,
        uri=args.uri,
        evaluation=args.evaluation,
        sweep=args.sweep,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "version":
            print(__version__)
            return 0
        if args.command == "audit":
            return _audit(args)
        if args.command == "crds":
            return _crds(args)
        if args.command == "images":
            return _images(args)
        if args.command == "releases":
            return releases_command.run(args)
        if args.command == "render":
            return _render(args)
        if args.command == "run":
            from speculator_operator.runtime.entry import run_operator

            return run_operator(args)
        if args.command == "stage":
            from speculator_operator.pods.stage import stage

            return stage(args.source, args.dest, args.revision, args.manifest, args.kind)
        if args.command == "vllm":
            from speculator_operator.pods.serve import exec_vllm

            rest = args.vllm_args[1:] if args.vllm_args[:1] == ["--"] else args.vllm_args
            return exec_vllm(rest, args.device_file)
        if args.command == "trainer":
            return _trainer(args)
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
