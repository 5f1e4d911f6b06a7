"""hack/release's pure parts: where each image goes, the values the packaged chart carries (the chart's own
values.yaml, four entries replaced, its comments kept), and which registries are spoken to over plain HTTP."""

from __future__ import annotations

import pytest
import yaml

from speculator_harness.release import CHART, destination, on_loopback, release_values, rewrite_values
from speculator_operator.domain.releases import get_release, operator_reference

D1, D2, D3 = ("sha256:" + c * 64 for c in "abc")


@pytest.mark.parametrize(
    ("registry", "loopback"),
    [("127.0.0.1:5000", True), ("localhost:5000/ml", True), ("127.0.0.2", True), ("[::1]:5000", True),
     ("registry.example.com/ml", False), ("10.0.0.1:5000", False), ("localhost.example.com", False)],
)  # fmt: skip
def test_a_registry_on_loopback_is_spoken_to_over_plain_http(registry: str, loopback: bool) -> None:
    assert on_loopback(registry) is loopback


def test_each_image_keeps_its_tag_under_the_registry() -> None:
    server = get_release().reference("server", "cpu")
    tag = server.rsplit(":", 1)[1]
    assert destination(server, "registry.example.com/ml") == f"registry.example.com/ml/server:{tag}"
    with pytest.raises(ValueError, match="not one of this project's images"):
        destination("docker.io/library/busybox:1", "registry.example.com/ml")


def test_the_packaged_values_name_the_pushed_images_by_digest() -> None:
    target = "127.0.0.1:5000/so"
    operator = destination(operator_reference(), target)
    trainer = destination(get_release().reference("trainer"), target)
    server = destination(get_release().reference("server", "cpu"), target)
    values = release_values(target, {operator: D1, trainer: D2, server: D3})
    assert values == {
        "image": {"repository": f"{target}/operator", "digest": D1},
        "workloadImages": {"repository": target, "digests": {server: D3, trainer: D2}},
    }
    with pytest.raises(ValueError, match="operator image"):
        release_values(target, {trainer: D2})

    text = (CHART / "values.yaml").read_text()
    out = rewrite_values(text, values)
    parsed, before = yaml.safe_load(out), yaml.safe_load(text)
    assert parsed["image"] == {**before["image"], **values["image"]}
    assert parsed["workloadImages"] == values["workloadImages"]
    assert {k: v for k, v in parsed.items() if k not in ("image", "workloadImages")} == {
        k: v for k, v in before.items() if k not in ("image", "workloadImages")
    }
    # every comment stays (helm show values reads them)
    assert [line.partition("#")[2] for line in text.splitlines()] == [
        line.partition("#")[2] for line in out.splitlines()
    ]
