"""The images tier, the trainer image of the release under check (tests/workloads/images.py): the versions installed in
it are the release table's and its torch is a CUDA build; speculators writes a checkpoint of every algorithm vLLM loads
as a draft on that torch (`train --dry-run`), and the audit of that release, run in the image, passes each one the
release's vLLM serves and refuses, naming the removal, any other (P-EAGLE from vLLM 0.34).

CI builds the default release's trainer image, so these run there for it; hack/qualify-release runs them for a release
it built with `hack/build-images --release NAME`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .images import qualifying, readable_copy, run_image

pytestmark = [pytest.mark.workloads, pytest.mark.images]

VERSIONS = """
import json, importlib.metadata as m, torch
names = ("torch", "transformers", "speculators", "hs-connectors")
print(json.dumps({"versions": {n: m.version(n) for n in names}, "cuda": torch.version.cuda}))
"""


def test_the_trainer_images_versions_are_the_release_tables_and_torch_is_a_cuda_build(
    trainer_image: str, record_property: pytest.RecordProperty
) -> None:
    release = qualifying()
    out = run_image(trainer_image, "-c", VERSIONS, entrypoint="python")
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    versions = seen["versions"]
    assert versions["torch"].split("+")[0] == release.torch
    assert (versions["transformers"], versions["speculators"], versions["hs-connectors"]) == (
        release.transformers, release.speculators, release.hs_connectors,
    )  # fmt: skip
    assert str(seen["cuda"]).startswith("13."), seen["cuda"]
    record_property("detail", f"installed {json.dumps(versions)}, torch CUDA {seen['cuda']}")


AUDIT = """
import json, sys
from speculator_operator.adapters.checkpoints import audit
from speculator_operator.domain.releases import release_row
release = release_row(sys.argv[1])
out = {}
for name in sys.argv[2:]:
    report = audit("/ckpt/" + name, release=release)
    out[name] = [f"{f.rule}: {f.message}" for f in report.errors]
print(json.dumps(out))
"""


def test_speculators_trains_every_algorithm_on_the_releases_torch_and_its_audit_judges_each(
    trainer_image: str, release_checkpoints: dict[str, Path], tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    release = qualifying()
    drafts = sorted(k for k in release_checkpoints if k != "verifier")
    root = tmp_path / "ckpt"
    root.mkdir()
    for name in drafts:
        readable_copy(release_checkpoints[name], root / name)
    out = run_image(trainer_image, "-c", AUDIT, release.name, *drafts, entrypoint="python", mounts={root: "/ckpt"})
    assert out.returncode == 0, out.stderr[-3000:]
    errors = json.loads(out.stdout.strip().splitlines()[-1])
    served = {name: errors[name] for name in drafts if release.serving_refusal(name) is None}
    refused = {name: errors[name] for name in drafts if release.serving_refusal(name) is not None}
    assert served
    assert all(found == [] for found in served.values()), served
    for name, found in refused.items():  # refused by the rule that names the removal, and by nothing else
        assert found == [f"vllm-loadable: {release.serving_refusal(name)}"], (name, found)
    record_property(
        "detail",
        f"trained and audit-clean for vLLM {release.vllm}: {', '.join(served)}"
        + (f"; refused as this vLLM does not serve them: {', '.join(refused)}" if refused else ""),
    )
