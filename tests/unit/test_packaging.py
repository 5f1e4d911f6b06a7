"""Images and the chart agree with the one source of each fact."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from speculator_operator.domain.releases import get_release, operator_image, package_tag

REPO = Path(__file__).resolve().parents[2]


def dockerfile_args(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), flags=re.M))


def test_server_image_pins_the_default_release() -> None:
    release = get_release()
    args = dockerfile_args(REPO / "server_image" / "Dockerfile")
    assert args["VLLM_VERSION"] == release.vllm
    assert args["TRANSFORMERS_VERSION"] == release.transformers  # the cuda variant installs it beside vLLM
    assert args["HS_CONNECTORS_VERSION"] == release.hs_connectors
    assert args["SPECULATOR_RELEASE"] == release.name
    assert release.image("server").endswith(f":{release.name}-{package_tag()}")
    assert release.image("server", "cpu").endswith(f":{release.name}-{package_tag()}-cpu")


def test_trainer_image_pins_the_default_release() -> None:
    release = get_release()
    args = dockerfile_args(REPO / "trainer_image" / "Dockerfile")
    assert args["TORCH_VERSION"] == release.torch
    assert args["TRANSFORMERS_VERSION"] == release.transformers
    assert args["SPECULATORS_VERSION"] == release.speculators
    assert args["HS_CONNECTORS_VERSION"] == release.hs_connectors
    assert args["SPECULATOR_RELEASE"] == release.name
    assert release.image("trainer").endswith(f":{release.name}-{package_tag()}")


def torch_stage(path: Path) -> str:
    text = path.read_text()
    return text[text.index("FROM ${BASE} AS torch") : text.index("# ---- end of the shared torch layer")]


def test_the_trainer_and_cpu_server_images_share_one_torch_layer() -> None:
    """Identical lines build one layer, stored once: the ~5 GB of torch are not there twice."""
    trainer = torch_stage(REPO / "trainer_image" / "Dockerfile")
    assert trainer == torch_stage(REPO / "server_image" / "Dockerfile")
    assert f"ARG TORCH_VERSION={get_release().torch}" in trainer


def test_the_chart_runs_the_operator_image_of_this_package_version() -> None:
    chart = (REPO / "charts" / "speculator-operator" / "Chart.yaml").read_text()
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f'appVersion: "{version}"' in chart
    assert operator_image().endswith(f"/operator:{version}")


def test_chart_crds_are_the_generated_ones() -> None:
    chart = {p.name: p.read_text() for p in (REPO / "charts" / "speculator-operator" / "crds").glob("*.yaml")}
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    assert chart == generated, "run: speculator-operator crds --output-dir charts/speculator-operator/crds"


def test_chart_default_release_is_the_table_default() -> None:
    values = (REPO / "charts" / "speculator-operator" / "values.yaml").read_text()
    assert f"defaultRelease: {get_release().name}" in values


def test_cluster_role_lists_every_verb_and_resource() -> None:
    rbac = (REPO / "charts" / "speculator-operator" / "templates" / "rbac.yaml").read_text()
    rules = re.sub(r"\{\{- /\*.*?\*/\}\}", "", rbac)  # template comments aside
    assert "*" not in rules


def test_the_cpu_node_example_names_the_cpu_server_image_of_this_release() -> None:
    example = (REPO / "examples" / "cpu-node.yaml").read_text()
    assert f"image: {get_release().image('server', 'cpu')}" in example
