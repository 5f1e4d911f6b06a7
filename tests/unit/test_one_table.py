"""One table per fact: algorithm names live in domain/algorithms.py and label keys in api/labels.py; any other
module of the package that spells one as a string literal fails here (prose that mentions them does not)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import get_args

from speculator_operator.api import labels
from speculator_operator.api.deployment import DeclaredAlgorithm
from speculator_operator.api.trainjob import Algorithm as SpecAlgorithm
from speculator_operator.domain import algorithms
from speculator_operator.domain.releases import VLLM_ALGORITHMS

PACKAGE = Path(algorithms.__file__).resolve().parents[1]
ALGORITHM_NAMES = {a.value for a in algorithms.Algorithm} | {f.value for f in algorithms.Family}
LABEL_KEYS = {v for k, v in vars(labels).items() if k.isupper() and isinstance(v, str)}
# the one place a literal must stay: a Literal type the CRD schema is made from (checked against the table below)
SPELLED_FOR_THE_SCHEMA = {
    ("api/trainjob/spec.py", 'Algorithm = Literal["eagle3", "peagle", "dflash", "dflash2", "dspark", "mtp"]'),
    (
        "api/deployment/inputs.py",
        'DeclaredAlgorithm = Literal["eagle3", "peagle", "dflash", "dflash2", "dspark", "mtp"]',
    ),
}


def literals(source: str, names: set[str]) -> list[tuple[int, str, str]]:
    """(line, literal, the line's text) of each string literal that is exactly one of `names`."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.STRING:
            continue
        match = re.fullmatch(r"""[rRbBuU]?(['"])(.*)\1""", tok.string, flags=re.S)
        if match and match[2] in names:
            found.append((tok.start[0], match[2], tok.line.strip()))
    return found


def spelled_outside(owner: str, names: set[str]) -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == owner:
            continue
        for line, literal, text in literals(path.read_text(), names):
            if (rel, text) not in SPELLED_FOR_THE_SCHEMA:
                out.append(f"{rel}:{line}: {literal!r}")
    return out


def test_the_scanner_finds_a_literal_and_leaves_prose_alone() -> None:
    source = 'if algo == "dspark":\n    why = "dspark drafts need a mask"\nlabel = "speculators.dev/stage"\n'
    assert [f[1] for f in literals(source, ALGORITHM_NAMES)] == ["dspark"]
    assert [f[1] for f in literals(source, LABEL_KEYS)] == ["speculators.dev/stage"]


def test_no_module_spells_an_algorithm_outside_the_table() -> None:
    assert spelled_outside("domain/algorithms.py", ALGORITHM_NAMES) == []


def test_no_module_spells_a_label_or_annotation_key_outside_labels() -> None:
    assert spelled_outside("api/labels.py", LABEL_KEYS) == []


def test_no_selector_spells_a_label_key_inside_a_string() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "labels.py":
            continue
        for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
            if tok.type == tokenize.STRING and any(f"{key}=" in tok.string for key in LABEL_KEYS):
                found.append(f"{path.relative_to(PACKAGE)}:{tok.start[0]}")
    assert found == []


def test_what_is_spelled_for_the_schema_and_derived_agrees_with_the_table() -> None:
    assert get_args(SpecAlgorithm) == algorithms.TRAINABLE
    served = [a.value for a, row in algorithms.TABLE.items() if row.vllm_method is not None or row.stitched]
    assert list(get_args(DeclaredAlgorithm)) == served
    # the spans as docs/reference/vllm.md gives them (from diffs of the released wheels), not as the table derives them
    assert {a: (str(s.first), s.removed and str(s.removed)) for a, s in VLLM_ALGORITHMS.items()} == {
        "eagle3": ("0.12.0", None),
        "peagle": ("0.22.0", "0.34.0"),
        "dflash": ("0.22.0", None),
        "dflash2": ("0.29.0", None),
        "dspark": ("0.25.0", None),
    }
    # every algorithm vLLM loads as a draft has a minimum vLLM, and one served stitched has none
    for name, row in algorithms.TABLE.items():
        assert (row.vllm_method is not None) == (row.min_vllm is not None), name
        assert not (row.stitched and row.vllm_method), name
    assert set(algorithms.MTP_TRAINABLE_VERIFIERS) <= set(algorithms.MTP_VERIFIERS)
