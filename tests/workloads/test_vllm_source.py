"""The images tier, the server image of the release under check (tests/workloads/images.py): what the operator
assumes of vLLM, read from that vLLM's installed code without a device (hack/lib/vllm_source_facts.py):

- the speculators types it registers serve exactly the algorithms the release table's spans say it serves
  (domain/releases.py: VLLM_ALGORITHMS), and it refuses the others;
- every key the renderer writes into --speculative-config for the release is a SpeculativeConfig field (vLLM stops
  at an unknown key);
- every metric the scrape reads (telemetry/vllm_metrics.py) is named in its source;
- the KV connector the extraction servers name is registered, and hs-connectors (which declares no vLLM dependency)
  implements that vLLM's connector API: it imports, leaves no abstract method open, and every method it overrides
  takes the base's parameters.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from speculator_operator.domain.releases import VLLM_ALGORITHMS
from speculator_operator.telemetry import vllm_metrics

from .. import render_cases
from ..lanes import REPO
from .images import qualifying, run_image

pytestmark = [pytest.mark.workloads, pytest.mark.images]
FACTS = REPO / "hack" / "lib" / "vllm_source_facts.py"
METRICS = [vllm_metrics.DRAFTS, vllm_metrics.DRAFT_TOKENS, vllm_metrics.ACCEPTED, vllm_metrics.PER_POSITION,
           vllm_metrics.GENERATED, vllm_metrics.RUNNING, vllm_metrics.ITL, vllm_metrics.STEPS]  # fmt: skip


@pytest.fixture(scope="module")
def facts(cuda_image: str) -> dict[str, Any]:
    out = run_image(cuda_image, "/facts.py", *METRICS, entrypoint="python", mounts={FACTS: "/facts.py"},
                    env={"VLLM_TARGET_DEVICE": "cpu"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_speculators_types_it_serves_are_the_ones_the_release_table_says(
    facts: dict[str, Any], record_property: pytest.RecordProperty
) -> None:
    release = qualifying()
    assert facts["vllm"] == release.vllm
    types = facts["speculators_types"]
    served = {name for name, how in types.items() if how == "accepted"}
    expected = {a for a, span in VLLM_ALGORITHMS.items() if span.covers(release.vllm_version)}
    assert served == expected, types
    record_property("detail", f"serves {', '.join(sorted(served))}; "
                    + "; ".join(f"{n} {how}" for n, how in sorted(types.items()) if how != "accepted"))  # fmt: skip


def test_every_key_the_renderer_writes_is_a_speculative_config_field(
    facts: dict[str, Any], record_property: pytest.RecordProperty
) -> None:
    written: set[str] = set()
    for _, docs in render_cases.rendered_for(qualifying()):
        if isinstance(docs, Exception):
            continue
        for doc in docs:
            for container in _containers(doc):
                args = container.get("args") or []
                if "--speculative-config" in args:
                    written |= set(json.loads(args[args.index("--speculative-config") + 1]))
    assert written
    missing = sorted(written - set(facts["spec_config_fields"]))
    assert missing == [], missing
    record_property("detail", f"keys written: {', '.join(sorted(written))}")


def test_every_metric_the_scrape_reads_is_in_its_source(
    facts: dict[str, Any], record_property: pytest.RecordProperty
) -> None:
    assert facts["metrics"] == dict.fromkeys(METRICS, True)
    record_property("detail", ", ".join(METRICS))


def test_the_extraction_connectors_are_there_and_hs_connectors_implements_its_api(
    facts: dict[str, Any], record_property: pytest.RecordProperty
) -> None:
    assert "ExampleHiddenStatesConnector" in facts["connectors"], facts["connectors"]
    for name, found in facts["hs_connectors"].items():
        assert found["import"] == "ok", (name, found["import"])
        assert found["unimplemented"] == [], (name, found)
        assert found["mismatches"] == [], (name, found["mismatches"])  # each override takes the base's calls
    record_property("detail", f"hs-connectors {qualifying().hs_connectors}: "
                    + ", ".join(sorted(facts["hs_connectors"])) + " import, implement every abstract method, and "
                    "override taking every call the base allows")  # fmt: skip


def _containers(doc: Any) -> list[dict[str, Any]]:
    if isinstance(doc, dict):
        here = doc.get("containers") if isinstance(doc.get("containers"), list) else []
        return [*here, *[c for v in doc.values() for c in _containers(v)]]
    if isinstance(doc, list):
        return [c for v in doc for c in _containers(v)]
    return []
