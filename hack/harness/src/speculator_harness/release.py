"""`hack/release REGISTRY`: the images hack/build-images built, pushed to REGISTRY under their own tags (the
release's and this package's version: `speculator-operator images`), and the chart, packaged with values that
name those images by digest, pushed beside them as an OCI artifact (`helm push` to oci://REGISTRY/charts).

REGISTRY is host[:port][/path]. The images go to REGISTRY/operator, REGISTRY/trainer and REGISTRY/server; the chart
to REGISTRY/charts/speculator-operator:CHART_VERSION. A registry on loopback (localhost, 127.0.0.0/8, ::1) is
spoken to over plain HTTP, as are the ones named with --plain-http; every other one over HTTPS with podman's and
helm's own credentials (`podman login`, `helm registry login`)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from speculator_harness import images, registry
from speculator_harness.cluster import CACHE
from speculator_operator.domain.releases import IMAGE_REPOSITORY, get_release, operator_reference

REPO = Path(__file__).resolve().parents[4]
CHART = REPO / "charts" / "speculator-operator"
CHARTS_PATH = "charts"  # oci://REGISTRY/charts/speculator-operator


def on_loopback(registry_ref: str) -> bool:
    host = registry_ref.split("/", 1)[0]
    if host.startswith("["):  # [::1]:5000
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def project_references() -> list[str]:
    """The images the chart's pods run, by tag as built: the operator, the trainer, both server variants (the cuda
    one only where hack/build-images --cuda built it)."""
    release = get_release()
    return [operator_reference(), release.reference("trainer"), release.reference("server"),
            release.reference("server", "cpu")]  # fmt: skip


def destination(ref: str, target: str) -> str:
    """`ghcr.io/speculator-operator/server:TAG` -> `REGISTRY/server:TAG`: the same tag under REGISTRY."""
    prefix = f"{IMAGE_REPOSITORY}/"
    if not ref.startswith(prefix):
        raise ValueError(f"{ref}: not one of this project's images ({prefix}...)")
    return f"{target}/{ref.removeprefix(prefix)}"


def release_values(target: str, digests: dict[str, str]) -> dict[str, Any]:
    """The values the packaged chart carries: REGISTRY's images, each pinned to the digest its push returned."""
    own = destination(operator_reference(), target)
    operator_digest = digests.get(own)
    if operator_digest is None:
        raise ValueError(f"the operator image {own} was not pushed")
    workload = {ref: digest for ref, digest in digests.items() if ref != own}
    return {
        "image": {"repository": own.rsplit(":", 1)[0], "digest": operator_digest},
        "workloadImages": {"repository": target, "digests": dict(sorted(workload.items()))},
    }


def rewrite_values(text: str, values: dict[str, Any]) -> str:
    """values.yaml with these four entries replaced in place (the comments kept, for `helm show values`)."""
    lines = text.splitlines()
    wanted = {
        ("image", "repository"): json.dumps(values["image"]["repository"]),
        ("image", "digest"): json.dumps(values["image"]["digest"]),
        ("workloadImages", "repository"): json.dumps(values["workloadImages"]["repository"]),
        ("workloadImages", "digests"): json.dumps(values["workloadImages"]["digests"], sort_keys=True),
    }
    section = ""
    done: set[tuple[str, str]] = set()
    for i, line in enumerate(lines):
        top = re.match(r"^([A-Za-z][\w-]*):", line)
        if top:
            section = top.group(1)
            continue
        found = re.match(r"^  ([A-Za-z][\w-]*):(\s|$)", line)
        if found and (section, found.group(1)) in wanted:
            comment = re.search(r"\s+#.*$", line)  # the values replaced hold no '#'
            lines[i] = f"  {found.group(1)}: {wanted[(section, found.group(1))]}" + (
                comment.group(0) if comment else ""
            )
            done.add((section, found.group(1)))
    if done != set(wanted):
        raise ValueError(f"values.yaml lacks {sorted(set(wanted) - done)}")
    out = "\n".join(lines) + "\n"
    parsed = yaml.safe_load(out)
    for sec, name in wanted:
        if parsed[sec][name] != values[sec][name]:
            raise ValueError(f"values.yaml: {sec}.{name} did not take the value {values[sec][name]!r}")
    return out


def helm_binary() -> str:
    found = os.environ.get("HELM") or shutil.which("helm")
    if found:
        return found
    bin_dir = subprocess.run([str(REPO / "hack" / "build-kube"), "--print-bin-dir"], capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
    return str(Path(bin_dir) / "helm")


def run(argv: list[str], env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/release", description=__doc__)
    parser.add_argument("registry", metavar="REGISTRY", help="host[:port][/path], e.g. registry.example.com/ml")
    parser.add_argument("--plain-http", action="store_true", help="HTTP, not HTTPS (implied for loopback)")
    args = parser.parse_args(argv)
    target = args.registry.rstrip("/").removeprefix("oci://")
    plain = args.plain_http or on_loopback(target)
    built = images.built_list(CACHE)
    refs = [ref for ref in project_references() if ref in built]
    if operator_reference() not in refs:
        print(f"release: {operator_reference()} is not built (hack/build-images)", file=sys.stderr)
        return 1
    if get_release().reference("server") not in refs:
        print(f"release: the CUDA server image {get_release().reference('server')} is not built (hack/release without "
              "--no-cuda builds it): only CPU serving pods will find their image", file=sys.stderr)  # fmt: skip

    digests: dict[str, str] = {}
    for ref in refs:
        dest = destination(ref, target)
        print(f"release: pushing {ref} to {dest}", file=sys.stderr)
        digests[dest] = registry.push_image(CACHE, ref, dest, tls_verify=not plain)
        print(f"{dest}@{digests[dest]}")
    values = release_values(target, digests)

    helm = helm_binary()
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / "speculator-operator"
        shutil.copytree(CHART, chart)
        (chart / "values.yaml").write_text(rewrite_values((chart / "values.yaml").read_text(), values))
        # helm's own state under the temporary folder; the registry credentials stay the user's (helm registry login)
        env = {**os.environ, "HELM_CACHE_HOME": f"{tmp}/cache"}
        run([helm, "lint", "--strict", str(chart)], env)
        run([helm, "package", str(chart), "--destination", tmp], env)
        package = next(Path(tmp).glob("speculator-operator-*.tgz"))
        version = package.name.removeprefix("speculator-operator-").removesuffix(".tgz")
        plain_flag = ["--plain-http"] if plain else []
        pushed = run([helm, "push", str(package), f"oci://{target}/{CHARTS_PATH}", *plain_flag], env)
    chart_digest = next((m for m in re.findall(r"sha256:[0-9a-f]{64}", pushed)), "")
    chart_ref = f"oci://{target}/{CHARTS_PATH}/speculator-operator"
    print(f"{chart_ref}:{version}@{chart_digest}")
    flag = " --plain-http" if plain else ""
    print(f"release: install with: helm install so {chart_ref} --version {version}{flag} -n speculator-system "
          "--create-namespace", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
