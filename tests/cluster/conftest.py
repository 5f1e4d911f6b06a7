"""Fixtures for tests against a real control plane.

One cluster per test session: if KUBECONFIG is set when the tests start, that cluster is used and
nothing is started; otherwise the local cluster (etcd, kube-apiserver, controller-manager, scheduler,
kwok, and one real node where this machine can run it) is started from the binaries of hack/build-kube
and the images of hack/build-images. One namespace per test.

SPECULATOR_REQUIRE_NODE=1 (hack/test sets it where it could build the images: root, apt) makes a real
node that cannot start a failure instead of a reason for the node tests to skip, and so a missing tool that
only a root set-up installs (promtool, podman). SPECULATOR_REQUIRE_TOOLS=1 (hack/test sets it always: it builds
helm beside kubectl and installs the operator's script in the venv) does the same for those tools: `missing`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest
from kopf.testing import KopfRunner
from kubernetes import client, config

from speculator_harness import ClusterInfo, LocalCluster, S3Info
from speculator_operator import controllers
from speculator_operator.domain import images
from speculator_operator.domain.releases import operator_reference
from speculator_operator.runtime.settings import Settings

from ..ckptgen import SMALL_QWEN3 as SMALL
from ..ckptgen import eagle3, write_checkpoint
from ..lanes import CONTROL_PLANE_LANE, in_node_lane, lane
from ..waiting import eventually

REPO = Path(__file__).resolve().parents[2]
# The operator runs in-process here, with these settings (runtime/settings.py; a variable set in the tests'
# environment, as hack/dev-cluster's SPECULATOR_SCRAPE_NETWORKS, wins): its verifier-revision timer ticks fast;
# its resync (60 s in a deployment) comes every 15 s, so that what only a read can see, such as a Job
# controller's refusal, comes within 15 s instead of a minute; its acceptance scrapes come every second and dial
# only addresses on this machine (the real node's pods, and kwok pods a test placed in 127.0.0.0/8 for a
# stand-in to answer): kwok's fake pod IPs are never dialled.
TEST_SETTINGS = {
    "SPECULATOR_POLL_TICK_SECONDS": "2",
    "SPECULATOR_RESYNC_SECONDS": "15",
    "SPECULATOR_SCRAPE_INTERVAL_SECONDS": "1",
    "SPECULATOR_SCRAPE_NETWORKS": "127.0.0.0/8,10.250.0.0/24",
    "SPECULATOR_SCRAPE_TIMEOUT_SECONDS": "1",
}
SETTINGS = Settings.from_env({**TEST_SETTINGS, **os.environ})
controllers.start(SETTINGS)  # every operator a test starts in this process runs with them


@dataclass
class Cluster:
    kubeconfig: Path
    kubectl_path: str
    api: client.ApiClient
    local: ClusterInfo | None  # None when the tests run against an existing cluster
    s3: S3Info | None
    harness: LocalCluster | None = None  # the supervisor of a local cluster: faults (restart a component)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        result = subprocess.run(
            [self.kubectl_path, *args], input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )
        return result


def _bin_dir() -> Path:
    env = os.environ.get("SPECULATOR_BIN_DIR")
    if env:
        return Path(env)
    out = subprocess.run(
        [str(REPO / "hack" / "build-kube"), "--print-bin-dir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return _bin_dir()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    external = os.environ.get("KUBECONFIG")
    if external:
        kubectl = shutil.which("kubectl")
        bins = os.environ.get("SPECULATOR_BIN_DIR")
        if bins and (Path(bins) / "kubectl").exists():
            kubectl = str(Path(bins) / "kubectl")
        assert kubectl, "KUBECONFIG is set but no kubectl was found (PATH or SPECULATOR_BIN_DIR)"
        s3 = None
        if os.environ.get("AWS_ENDPOINT_URL"):
            s3 = S3Info(
                os.environ["AWS_ENDPOINT_URL"],
                os.environ.get("AWS_ACCESS_KEY_ID", ""),
                os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
                os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            )
        yield Cluster(Path(external), kubectl, config.new_client_from_config(external), None, s3)
        return

    workdir = Path(os.environ.get("SPECULATOR_TEST_CLUSTER_DIR") or tmp_path_factory.mktemp("cluster"))
    # the control plane's lane runs beside the real node's (hack/test): the machine's one node is that lane's
    wanted = False if lane() == CONTROL_PLANE_LANE else True if node_required() else None
    local = LocalCluster(workdir, _bin_dir(), real_node=wanted, timeout=300)
    info = local.start()
    try:
        api = config.new_client_from_config(str(info.kubeconfig))
        yield Cluster(info.kubeconfig, str(info.kubectl), api, info, info.s3, local)
    finally:
        local.stop()


def node_required() -> bool:
    return os.environ.get("SPECULATOR_REQUIRE_NODE") == "1"


def tools_required() -> bool:
    return os.environ.get("SPECULATOR_REQUIRE_TOOLS") == "1"


def missing(what: str, required: bool | None = None) -> NoReturn:
    """The test cannot run without `what` (a tool, a script): a skip that says so where the run did not
    promise it, a failure where it did: `required`, by default SPECULATOR_REQUIRE_TOOLS=1 (hack/test, which
    provides helm and the operator's script); pass `node_required()` for what only a root set-up installs."""
    if tools_required() if required is None else required:
        pytest.fail(f"{what}, although this run provides it (SPECULATOR_REQUIRE_TOOLS / SPECULATOR_REQUIRE_NODE)")
    pytest.skip(what)


OPERATOR = Path(sys.executable).with_name("speculator-operator")


def operator_script() -> Path:
    """The operator's console script, installed beside this Python by the venv (hack/lib/venv.sh)."""
    if not OPERATOR.exists():
        missing(f"no {OPERATOR.name} script beside {sys.executable}")
    return OPERATOR


def helm_beside(cluster: Cluster) -> Path:
    """helm, built by hack/build-kube beside its kubectl."""
    exe = Path(cluster.kubectl_path).with_name("helm")
    if not exe.exists():
        missing(f"no helm beside {cluster.kubectl_path}")
    return exe


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a lane (SPECULATOR_TEST_LANE, tests/lanes.py) only that lane's part of tests/cluster runs. Tests that
    need no real node to be up (they start and stop their own) run before the session's cluster starts one."""
    wanted = lane()
    if wanted is not None:
        cluster_dir = Path(__file__).resolve().parent
        other = [item for item in items
                 if cluster_dir in Path(str(item.path)).resolve().parents
                 and in_node_lane(item) != (wanted != CONTROL_PLANE_LANE)]  # fmt: skip
        if other:
            config.hook.pytest_deselected(items=other)
            dropped = {id(item) for item in other}
            items[:] = [item for item in items if id(item) not in dropped]
    items.sort(key=lambda item: item.get_closest_marker("before_cluster") is None)


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> str:
    """The real node's name; the test is skipped (with the reason) where none runs."""
    if cluster.local is None:
        pytest.skip("the cluster under test came from KUBECONFIG: no real node of ours")
    if cluster.local.node is None:
        pytest.skip(f"no real node here: {cluster.local.node_unavailable}")
    return cluster.local.node


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (the controller-manager finalises it)."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"speculators.dev/test": "true"}))
    )
    # pods are admitted only once the namespace's `default` ServiceAccount exists
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="session")
def operator_crds(cluster: Cluster) -> list[str]:
    """The project's CRDs from crds/, applied once per session and Established."""
    names = []
    for path in sorted((REPO / "crds").glob("*.yaml")):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        names.append(path.name.split("_", 1)[1].removesuffix(".yaml") + "." + path.name.split("_", 1)[0])
    for name in names:
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        plural = name.split(".", 1)[0]
        # Established comes a moment before discovery serves the new kind
        eventually(lambda p=plural: cluster.kubectl("get", p, "-A", "-o", "name"), timeout=60)
    return names


T = TypeVar("T")


@pytest.fixture(scope="module")
def operator(cluster: Cluster, operator_crds: list[str]) -> Iterator[KopfRunner]:
    """The operator (both kinds) in-process, watching every namespace; one per test module."""
    # the kubeconfig (the kubernetes client's own variable), and the digests the harness pushed (the pods it
    # renders run exactly those builds)
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    if cluster.local is not None and cluster.local.image_digests:
        controllers.start(dataclasses.replace(SETTINGS, image_digests=dict(cluster.local.image_digests)))
    args = ["run", "--standalone", "--all-namespaces", "-m", "speculator_operator.controllers"]
    try:
        with KopfRunner(args, timeout=60) as runner:
            yield runner
    finally:
        controllers.start(SETTINGS)
        images.use(None)  # this process's own renders: as its environment says, as before the operator ran
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
    assert runner.exception is None, runner.exception


def chart_image_values(cluster: Cluster) -> dict[str, Any]:
    """The chart values that pin the operator's image and its pods' images to the digests the harness pushed
    (empty against a cluster of someone else's)."""
    digests = cluster.local.image_digests if cluster.local is not None else {}
    if not digests:
        return {}
    values: dict[str, Any] = {"workloadImages": {"digests": digests}}
    own = digests.get(operator_reference())
    if own:
        values["image"] = {"digest": own}
    return values


@pytest.fixture(scope="session")
def store(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Checkpoints and a verifier config in the real S3 server; returns their URIs."""
    if cluster.s3 is None:
        pytest.skip("no S3 server: the cluster came from KUBECONFIG and AWS_ENDPOINT_URL is not set")
    s3 = cluster.s3.client()
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    root = tmp_path_factory.mktemp("store")
    good_config, good_tensors = eagle3(SMALL, draft_vocab=1024)
    write_checkpoint(root / "good", good_config, good_tensors, sparse=False)
    bad_tensors = dict(good_tensors)
    bad_tensors["fc.weight"] = ("BF16", [256, 512])  # two aux layers' worth where the config says three
    write_checkpoint(root / "bad", good_config, bad_tensors, sparse=False)
    (root / "verifier").mkdir()
    (root / "verifier" / "config.json").write_text(json.dumps(SMALL))
    for folder in ("good", "bad", "verifier"):
        for f in (root / folder).iterdir():
            s3.upload_file(str(f), bucket, f"{folder}/{f.name}")
    rows = [{"conversations": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "ok"}]}
            for i in range(4)]  # fmt: skip
    s3.put_object(Bucket=bucket, Key="data/chat.jsonl", Body="".join(json.dumps(r) + "\n" for r in rows).encode())
    return {"good": f"s3://{bucket}/good", "bad": f"s3://{bucket}/bad", "verifier": f"s3://{bucket}/verifier",
            "data": f"s3://{bucket}/data/chat.jsonl"}  # fmt: skip


@pytest.fixture
def creds(cluster: Cluster, namespace: str) -> str:
    assert cluster.s3 is not None
    client.CoreV1Api(cluster.api).create_namespaced_secret(namespace, client.V1Secret(
        metadata=client.V1ObjectMeta(name="s3"), string_data=cluster.s3.env()))  # fmt: skip
    return "s3"


@pytest.fixture
def s3(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A client of the real S3 server; the AWS_* variables are set for the code under test too."""
    import boto3

    assert cluster.s3 is not None
    for key, value in cluster.s3.env().items():
        monkeypatch.setenv(key, value)
    return boto3.client("s3")


def sdep(name: str, store: dict[str, str], draft: str, creds: str, **serving: Any) -> str:
    return json.dumps({
        "apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorDeployment", "metadata": {"name": name},
        "spec": {"verifier": {"model": store["verifier"], "credentials": {"name": creds}},
                 "speculator": {"source": store[draft], "credentials": {"name": creds}},
                 "serving": {"replicas": 2, **serving}},
    })  # fmt: skip


def get(cluster: Cluster, namespace: str, what: str) -> dict[str, Any]:
    return json.loads(cluster.kubectl("get", "-n", namespace, what, "-o", "json").stdout)  # type: ignore[no-any-return]


@pytest.fixture
def workspace(cluster: Cluster, namespace: str) -> Iterator[Callable[[str], str]]:
    """Makes a PersistentVolume bound in advance to `<namespace>/<claim>` (no provisioner runs here), as an
    RWX volume that a cluster admin would provide; returns the claim name. Removed afterwards."""
    core = client.CoreV1Api(cluster.api)
    made: list[str] = []

    def make(claim: str) -> str:
        name = f"pv-{namespace}-{claim}"[:253]
        core.create_persistent_volume(client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=name, labels={"speculators.dev/test": "true"}),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "1Ti"}, access_modes=["ReadWriteMany", "ReadWriteOnce"],
                host_path=client.V1HostPathVolumeSource(path=f"/tmp/{name}"),  # kwok starts no container
                claim_ref=client.V1ObjectReference(namespace=namespace, name=claim),
                persistent_volume_reclaim_policy="Delete",
            ),
        ))  # fmt: skip
        made.append(name)
        return claim

    yield make
    for name in made:
        with contextlib.suppress(client.ApiException):
            core.delete_persistent_volume(name)


def existing_claim(cluster: Cluster, namespace: str, workspace: Callable[[str], str], name: str) -> str:
    """A workspace claim made in advance (spec.workspace.claimName), bound to a volume the fixture provides."""
    claim = client.V1PersistentVolumeClaim(
        metadata=client.V1ObjectMeta(name=workspace(name)),
        spec=client.V1PersistentVolumeClaimSpec(
            access_modes=["ReadWriteMany"],
            resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            storage_class_name="",
        ),
    )
    client.CoreV1Api(cluster.api).create_namespaced_persistent_volume_claim(namespace, claim)
    return name


def stj(name: str, store: dict[str, str], creds: str, **spec: Any) -> str:
    """A SpeculatorTrainJob manifest on the store's verifier; `spec` entries replace the defaults."""
    body: dict[str, Any] = {
        "verifier": {"model": store["verifier"], "credentials": {"name": creds}},
        "algorithm": "eagle3",
        "data": {"sources": [store["data"]]},
        "output": {"uri": store["good"], "credentials": {"name": creds}},
        "retries": 0,
        **spec,
    }
    return json.dumps({"apiVersion": "speculators.dev/v1alpha1", "kind": "SpeculatorTrainJob",
                       "metadata": {"name": name}, "spec": body})  # fmt: skip


ARGOCD_SCRIPTS = REPO / "gitops" / "argocd" / "resource_customizations" / "speculators.dev"
ARGOCD_DEPLOYMENT = ARGOCD_SCRIPTS / "SpeculatorDeployment" / "health.lua"


def gitops(bin_dir: Path, *args: str, objects: Any = None) -> Any:
    """What the GitOps tools' own code says of `objects` (hack/gitops/main.go: kstatus, an Argo CD script)."""
    done = subprocess.run([str(bin_dir / "gitops-check"), *args], input=json.dumps(objects), capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout)
