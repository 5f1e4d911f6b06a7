"""The pinned release table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.domain import qualification
from speculator_operator.domain.qualification import Level
from speculator_operator.domain.releases import (
    DEFAULT_RELEASE,
    RELEASES,
    ReleaseError,
    Version,
    get_release,
    package_tag,
    release_for,
    release_row,
    supported,
    supports,
)


def test_default_release_is_served_and_pins_everything() -> None:
    r = get_release()
    assert r.name == DEFAULT_RELEASE
    assert r.level is Level.SERVED
    assert (r.speculators, r.hs_connectors) == ("0.9.0", "0.9.0")
    assert r.vllm_version >= Version.parse("0.32.0")
    for role in ("trainer", "extraction", "server"):
        assert r.image(role).endswith(f":{r.name}-{package_tag()}")  # the release and this package's version


def test_unknown_and_unqualified_requests_name_the_supported_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(qualification, "EVIDENCE_DIR", tmp_path)  # no release has evidence
    names = ", ".join(x.name for x in supported())
    assert names == DEFAULT_RELEASE
    with pytest.raises(ReleaseError, match="unknown release 'nope'") as err:
        get_release("nope")
    assert names.split(",")[0] in str(err.value)
    unqualified = [r for r in RELEASES.values() if r.level is Level.UNQUALIFIED]
    assert [r.name for r in unqualified] == ["2026.12-vllm0.34"]
    with pytest.raises(
        ReleaseError, match=r"is Unqualified: no passed qualification \(hack/qualify-release 2026\.12-vllm0\.34\)"
    ) as err:
        get_release(unqualified[0].name)
    assert DEFAULT_RELEASE in str(err.value)
    with pytest.raises(ReleaseError, match="not a combination this project has qualified"):
        release_for(vllm=unqualified[0].vllm)
    with pytest.raises(ReleaseError, match=r"no release pins vLLM 0\.11\.0"):
        release_for(vllm="0.11.0")
    with pytest.raises(ReleaseError, match="not a version"):
        release_for(vllm="latest")
    assert release_for(vllm="0.32.0").name == DEFAULT_RELEASE
    assert release_row("2026.12-vllm0.34").vllm == "0.34.0"  # qualification reads the row of any level


def test_passed_evidence_makes_a_release_without_a_cpu_build_checked_and_a_failed_check_does_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(qualification, "EVIDENCE_DIR", tmp_path)
    installed = {"torch": "2.14.0", "vllm": "0.34.0"}
    image = {"reference": "r/server:x", "digest": "sha256:" + "a" * 64, "stack": qualification.stack_digest(installed),
             "installed": installed}  # fmt: skip
    record = {"release": "2026.12-vllm0.34", "recorded": "2026-12-07", "machine": "m", "command": "c",
              "images": {"server": image}, "checks": [{"name": "versions", "passed": True}],
              "served": "no CPU build"}  # fmt: skip
    (tmp_path / "2026.12-vllm0.34.json").write_text(json.dumps(record))
    assert get_release("2026.12-vllm0.34").level is Level.CHECKED
    record["checks"].append({"name": "vllm-parser", "passed": False, "detail": "refused"})
    (tmp_path / "2026.12-vllm0.34.json").write_text(json.dumps(record))
    with pytest.raises(ReleaseError, match="is Unqualified"):
        get_release("2026.12-vllm0.34")


def test_the_stack_digest_leaves_this_package_out() -> None:
    freeze = "torch==2.14.0\nspeculator_operator==0.1.0.dev0\nVLLM==0.34.0\n"
    assert qualification.installed_versions(freeze) == {"torch": "2.14.0", "vllm": "0.34.0"}
    a = qualification.stack_digest({"torch": "2.14.0", "vllm": "0.34.0", "speculator-operator": "1"})
    assert a == qualification.stack_digest({"vllm": "0.34.0", "torch": "2.14.0"})
    assert a != qualification.stack_digest({"vllm": "0.34.0", "torch": "2.14.1"})


def test_cut_off_knobs_by_version() -> None:
    assert supports(Version.parse("0.16.0"), "disable_by_batch_size")
    assert not supports(Version.parse("0.17.0"), "disable_by_batch_size")
    assert not supports(Version.parse("0.23.1"), "num_speculative_tokens_per_batch_size")
    assert supports(Version.parse("0.24.0"), "num_speculative_tokens_per_batch_size")


def test_a_span_covers_its_first_release_and_none_from_its_removal() -> None:
    """One mechanism for what differs between releases: P-EAGLE's parallel drafting from 0.16.0 to before 0.34.0."""
    assert [supports(Version.parse(v), "parallel_drafting") for v in ("0.15.1", "0.16.0", "0.33.0", "0.34.0")] == [
        False, True, True, False,
    ]  # fmt: skip
    assert supports(Version.parse("0.33.0"), "model_runner_v1")
    assert not supports(Version.parse("0.34.0"), "model_runner_v1")
    release = get_release()
    assert release.serving_refusal("peagle") is None  # 0.32 serves it
    assert release.serving_refusal("xpress") == "vLLM 0.32.0 has no xpress drafter"


def test_version_ordering() -> None:
    assert Version.parse("0.9.0") < Version.parse("0.10.1") < Version.parse("v0.32") == Version.parse("0.32.0")
    assert str(Version.parse("0.32.0+cpu")) == "0.32.0"


def test_a_pre_release_orders_before_its_release_and_a_local_label_names_the_release() -> None:
    assert Version.parse("0.33.0rc1") < Version.parse("0.33.0") < Version.parse("0.33.1.dev0")
    assert Version.parse("0.32.0+cpu") == Version.parse("0.32.0")
    with pytest.raises(ReleaseError, match="not a version"):
        Version.parse("latest")


def test_a_spec_that_names_no_release_keeps_the_one_it_was_resolved_to_when_the_default_moves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from speculator_operator.api.deployment import SpeculatorDeploymentSpec
    from speculator_operator.planning import Problem, parse_spec

    raw = {"verifier": {"model": "Qwen/Qwen3-8B"}, "speculator": {"source": "hf://acme/d"}}
    monkeypatch.setattr(qualification, "EVIDENCE_DIR", tmp_path)
    (tmp_path / "2026.12-vllm0.34.json").write_text(json.dumps({
        "release": "2026.12-vllm0.34", "recorded": "2026-12-07", "machine": "m", "command": "c", "images": {},
        "checks": [{"name": "all", "passed": True}], "served": "not served"}))  # fmt: skip
    monkeypatch.setenv("SPECULATOR_DEFAULT_RELEASE", "2026.12-vllm0.34")  # the operator's default moved
    new = parse_spec(SpeculatorDeploymentSpec, raw)
    kept = parse_spec(SpeculatorDeploymentSpec, raw, "2026.11-vllm0.32")
    named = parse_spec(SpeculatorDeploymentSpec, {**raw, "release": "2026.12-vllm0.34"}, "2026.11-vllm0.32")
    assert not isinstance(new, Problem)
    assert not isinstance(kept, Problem)
    assert not isinstance(named, Problem)
    assert (new[1].name, kept[1].name, named[1].name) == ("2026.12-vllm0.34", "2026.11-vllm0.32", "2026.12-vllm0.34")
    gone = parse_spec(SpeculatorDeploymentSpec, raw, "2025.01-vllm0.1")  # no longer in the table: the default
    assert not isinstance(gone, Problem)
    assert gone[1].name == "2026.12-vllm0.34"


def test_a_train_job_on_another_release_renders_every_stage_with_that_releases_images() -> None:
    from speculator_operator.api.trainjob import SpeculatorTrainJobSpec
    from speculator_operator.render import training

    spec = SpeculatorTrainJobSpec.model_validate({
        "verifier": {"model": "Qwen/Qwen3-8B"}, "algorithm": "dflash", "release": "2026.12-vllm0.34",
        "data": {"sources": ["hf:HuggingFaceH4/ultrachat_200k"]}, "output": {"uri": "s3://drafts/q"},
        "evaluation": {"heldOut": 16}})  # fmt: skip
    release = release_row("2026.12-vllm0.34")
    children = training.render_all(training.Inputs("q", "ml", spec, release, "abc", 36, "uid"))

    def images(doc: Any) -> list[str]:
        if isinstance(doc, dict):
            return ([doc["image"]] if isinstance(doc.get("image"), str) else []) + [
                i for v in doc.values() for i in images(v)
            ]
        return [i for v in doc for i in images(v)] if isinstance(doc, list) else []

    found = {i for c in children for i in images(c)}
    assert found
    assert all(f":{release.name}-{package_tag()}" in i for i in found), found
    assert any("/trainer:" in i for i in found)
    assert any("/server:" in i for i in found)  # the extraction and evaluation servers: its vLLM


def test_every_recorded_evidence_file_reads_and_names_its_own_release() -> None:
    """A committed evidence file must load (a malformed one would fail every pass that asks a level) and be about the
    release its name says, and that release must be in the table."""
    files = sorted(qualification.EVIDENCE_DIR.glob("*.json"))
    assert files, "no evidence is recorded: the default release's at least is committed"
    for path in files:
        recorded = qualification.evidence(path.stem)
        assert recorded is not None, path.name
        assert recorded.release == path.stem, path.name
        assert release_row(path.stem).name == path.stem
