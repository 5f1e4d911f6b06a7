"""Images and the chart agree with the one source of each fact."""

from __future__ import annotations

import re
from pathlib import Path

from speculator_operator.releases import get_release

REPO = Path(__file__).resolve().parents[2]


def dockerfile_args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), flags=re.M))


def test_server_image_pins_the_default_release() -> None:
    release = get_release()
    args = dockerfile_args(REPO / "server_image" / "Dockerfile")
    assert args["VLLM_VERSION"] == release.vllm
    assert args["HS_CONNECTORS_VERSION"] == release.hs_connectors
    assert args["SPECULATOR_RELEASE"] == release.name
    assert release.image("server").endswith(":" + args["SPECULATOR_RELEASE"])


def test_trainer_image_pins_the_default_release() -> None:
    release = get_release()
    args = dockerfile_args(REPO / "trainer_image" / "Dockerfile")
    assert args["TORCH_VERSION"] == release.torch
    assert args["TRANSFORMERS_VERSION"] == release.transformers
    assert args["SPECULATORS_VERSION"] == release.speculators
    assert args["HS_CONNECTORS_VERSION"] == release.hs_connectors
    assert args["SPECULATOR_RELEASE"] == release.name
    assert release.image("trainer").endswith(":" + args["SPECULATOR_RELEASE"])


def test_chart_crds_are_the_generated_ones() -> None:
    chart = {p.name: p.read_text() for p in (REPO / "charts" / "speculator-operator" / "crds").glob("*.yaml")}
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    assert chart == generated, "run: speculator-operator crds --output-dir charts/speculator-operator/crds"


def test_chart_default_release_is_the_table_default() -> None:
    values = (REPO / "charts" / "speculator-operator" / "values.yaml").read_text()
    assert f"defaultRelease: {get_release().name}" in values


def test_cluster_role_lists_every_verb_and_resource() -> None:
    rbac = (REPO / "charts" / "speculator-operator" / "templates" / "rbac.yaml").read_text()
    assert "*" not in rbac
