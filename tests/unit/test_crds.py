"""The CRDs are generated from the pydantic models; crds/ must not drift from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from speculator_operator.api.crds import all_crds
from speculator_operator.api.schema import SchemaError, structural
from speculator_operator.cli import render_yaml

REPO = Path(__file__).resolve().parents[2]


def test_crds_folder_matches_the_models() -> None:
    generated = {name: render_yaml(crd) for name, crd in all_crds().items()}
    on_disk = {p.name: p.read_text() for p in (REPO / "crds").glob("*.yaml")}
    assert set(on_disk) == set(generated), "run: speculator-operator crds --output-dir crds"
    for name, text in generated.items():
        assert on_disk[name] == text, (
            f"crds/{name} drifted from the models; run: speculator-operator crds --output-dir crds"
        )


def test_every_kind_is_in_the_speculators_category_with_a_status_subresource() -> None:
    for crd in all_crds().values():
        assert "speculators" in crd["spec"]["names"]["categories"]
        version = crd["spec"]["versions"][0]
        assert version["subresources"] == {"status": {}}
        assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Phase", "Age"}


def test_non_structural_unions_are_refused() -> None:
    from pydantic import BaseModel

    class Bad(BaseModel):
        value: int | list[str]

    with pytest.raises(SchemaError, match="not structural"):
        structural(Bad)
