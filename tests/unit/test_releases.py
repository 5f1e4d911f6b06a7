"""The pinned release table."""

from __future__ import annotations

import pytest

from speculator_operator.domain.releases import (
    DEFAULT_RELEASE,
    RELEASES,
    ReleaseError,
    Version,
    get_release,
    package_tag,
    release_for,
    supported,
    supports,
)


def test_default_release_is_verified_and_pins_everything() -> None:
    r = get_release()
    assert r.name == DEFAULT_RELEASE
    assert r.verified
    assert (r.speculators, r.hs_connectors) == ("0.9.0", "0.9.0")
    assert r.vllm_version >= Version.parse("0.32.0")
    for role in ("trainer", "extraction", "server"):
        assert r.image(role).endswith(f":{r.name}-{package_tag()}")  # the release and this package's version


def test_unknown_and_unverified_requests_name_the_supported_ones() -> None:
    names = ", ".join(x.name for x in supported())
    with pytest.raises(ReleaseError, match="unknown release 'nope'") as err:
        get_release("nope")
    assert names.split(",")[0] in str(err.value)
    unverified = [r for r in RELEASES.values() if not r.verified]
    assert unverified, "the table should show what an unverified release looks like"
    with pytest.raises(ReleaseError, match="has not been verified") as err:
        get_release(unverified[0].name)
    assert DEFAULT_RELEASE in str(err.value)
    with pytest.raises(ReleaseError, match="not a combination CI has verified"):
        release_for(vllm=unverified[0].vllm)
    with pytest.raises(ReleaseError, match=r"no release pins vLLM 0\.11\.0"):
        release_for(vllm="0.11.0")
    with pytest.raises(ReleaseError, match="not a version"):
        release_for(vllm="latest")
    assert release_for(vllm="0.32.0").name == DEFAULT_RELEASE


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
