"""The CRDs are generated from the pydantic models; crds/ must not drift from them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.api.crds import all_crds
from speculator_operator.api.schema import SchemaError, structural
from speculator_operator.commands.crds import render_yaml

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


def _fields(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field under `schema` as (path, its schema): object properties, array items' and map values' fields."""
    for name, sub in (schema.get("properties") or {}).items():
        yield f"{path}.{name}", sub
        yield from _fields(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _fields(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _fields(schema["additionalProperties"], f"{path}{{}}")


def _served_parts() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind/version, spec or status, its schema) for every version each CRD serves."""
    for crd in all_crds().values():
        for version in crd["spec"]["versions"]:
            if not version["served"]:
                continue
            root = version["schema"]["openAPIV3Schema"]["properties"]
            for part in ("spec", "status"):
                yield f"{crd['spec']['names']['kind']}/{version['name']}", part, root[part]


def test_every_field_of_spec_and_status_has_a_description() -> None:
    """`kubectl explain` and docs/reference/api.md show a field's description: none may be left out."""
    missing = [
        f"{kind} {path}"
        for kind, part, schema in _served_parts()
        for path, sub in [(part, schema), *_fields(schema, part)]
        if not str(sub.get("description") or "").strip()
    ]
    assert missing == [], "fields without a description (give each a Field(description=...)):\n" + "\n".join(missing)


def test_the_description_walk_reaches_nested_objects_array_items_and_both_kinds() -> None:
    seen = {f"{kind} {path}" for kind, part, schema in _served_parts() for path, _ in _fields(schema, part)}
    for path in (
        "SpeculatorDeployment/v1alpha1 status.conditions[].reason",  # an array's items
        "SpeculatorDeployment/v1alpha1 status.canary.counts.passedInARow",  # nested objects
        "SpeculatorTrainJob/v1alpha1 spec.stages.trainer.nodeSelector",
        "SpeculatorTrainJob/v1alpha1 status.provenance.evaluation.sweep.best[].concurrency",
    ):
        assert path in seen
