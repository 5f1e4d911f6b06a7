"""`speculator-operator render FILE...`: the children a SpeculatorDeployment or SpeculatorTrainJob would get,
rendered without a cluster (the GitOps preview). render_documents and format_rendered are the library half that
tests/render_cases.py snapshots; run() is the command: it reads the manifests and the flags and prints the YAML."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from speculator_operator.adapters.checkpoints import audit, read_verifier
from speculator_operator.api.common import GROUP as API_GROUP
from speculator_operator.commands.usage import UsageError
from speculator_operator.domain.algorithms import Algorithm
from speculator_operator.domain.checkpoint import AuditReport, CheckpointError, VerifierRef
from speculator_operator.domain.releases import Release, get_release, release_row
from speculator_operator.render.serving import RenderError


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


def run(args: argparse.Namespace) -> int:
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

    given = ",".join(args.image_pull_secret) if args.image_pull_secret else os.environ.get(PULL_SECRETS_ENV, "")
    environ = {PULL_SECRETS_ENV: given}  # this setting alone: the others are the operator process's
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
