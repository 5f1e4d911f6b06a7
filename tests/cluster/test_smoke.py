"""Smoke tests of the real control plane: what later issues rely on must hold here first."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from .conftest import Cluster, helm_beside

pytestmark = pytest.mark.cluster

GROUP = "smoke.speculators.dev"
CATEGORY = "smoketests"

WIDGET_CRD = f"""
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{GROUP}
spec:
  group: {GROUP}
  scope: Namespaced
  names:
    kind: Widget
    plural: widgets
    singular: widget
    shortNames: [wdg]
    categories: [{CATEGORY}]
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {{status: {{}}}}
    additionalPrinterColumns:
    - {{name: Size, type: integer, jsonPath: .spec.size}}
    - {{name: Mode, type: string, jsonPath: .spec.mode}}
    - {{name: Phase, type: string, jsonPath: .status.phase}}
    - {{name: Age, type: date, jsonPath: .metadata.creationTimestamp}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            x-kubernetes-validations:
            - rule: "!has(self.minSize) || self.minSize <= self.size"
              message: "minSize must not exceed size"
            properties:
              size: {{type: integer, minimum: 1, maximum: 64}}
              minSize: {{type: integer}}
              mode: {{type: string, enum: [fast, careful]}}
          status:
            type: object
            properties:
              phase: {{type: string}}
"""


@pytest.fixture(scope="session")
def widget_crd(cluster: Cluster) -> Iterator[str]:
    cluster.kubectl("apply", "-f", "-", input=WIDGET_CRD)
    cluster.kubectl("wait", "--for=condition=Established", f"crd/widgets.{GROUP}", "--timeout=60s")
    yield f"widgets.{GROUP}"
    cluster.kubectl("delete", "crd", f"widgets.{GROUP}", "--wait=false", check=False)


def widget(name: str, **spec: object) -> str:
    return json.dumps({"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})


def test_kubectl_and_server_report_the_pinned_version(cluster: Cluster) -> None:
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert out["clientVersion"]["gitVersion"] == "v1.37.2"
    if cluster.local is not None:
        assert out["serverVersion"]["gitVersion"] == "v1.37.2"


def test_category_lists_objects_with_printer_columns(cluster: Cluster, widget_crd: str, namespace: str) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget("alpha", size=8, mode="fast"))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget("beta", size=3, mode="careful"))
    out = cluster.kubectl("get", CATEGORY, "-n", namespace).stdout
    lines = out.strip().splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "MODE", "PHASE", "AGE"]
    rows = {line.split()[0]: line.split()[1:3] for line in lines[1:]}
    assert rows == {
        "alpha": ["8", "fast"],
        "beta": ["3", "careful"],
    }
    # the short name resolves as well
    assert "alpha" in cluster.kubectl("get", "wdg", "-n", namespace, "-o", "name").stdout


def test_schema_violations_are_rejected_with_field_level_messages(
    cluster: Cluster, widget_crd: str, namespace: str
) -> None:
    bad = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", check=False, input=widget("bad", size=100, mode="reckless")
    )
    assert bad.returncode != 0
    assert "spec.size: Invalid value: 100: spec.size in body should be less than or equal to 64" in bad.stderr
    assert 'spec.mode: Unsupported value: "reckless"' in bad.stderr

    cel = cluster.kubectl("apply", "-n", namespace, "-f", "-", check=False, input=widget("bad-cel", size=4, minSize=9))
    assert cel.returncode != 0
    assert "spec: Invalid value" in cel.stderr
    assert "minSize must not exceed size" in cel.stderr

    missing = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", check=False, input=widget("bad-missing", mode="fast")
    )
    assert missing.returncode != 0
    assert "spec.size: Required value" in missing.stderr
    # nothing was stored
    assert cluster.kubectl("get", "widgets", "-n", namespace, "-o", "name").stdout.strip() == ""


def job_manifest(name: str, labels: dict[str, str] | None = None, gpus: int = 0) -> client.V1Job:
    resources = client.V1ResourceRequirements()
    tolerations = None
    if gpus:
        resources = client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)})
        tolerations = [client.V1Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")]
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels or {}),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    tolerations=tolerations,
                    containers=[
                        client.V1Container(name="main", image="busybox:1.36", command=["true"], resources=resources)
                    ],
                ),
            ),
        ),
    )


def job_pods(cluster: Cluster, namespace: str, job: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(
        namespace, label_selector=f"batch.kubernetes.io/job-name={job}"
    )
    return list(pods.items)


def test_job_runs_to_complete(cluster: Cluster, namespace: str) -> None:
    client.BatchV1Api(cluster.api).create_namespaced_job(namespace, job_manifest("ok"))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Complete", "job/ok", "--timeout=90s")
    (pod,) = job_pods(cluster, namespace, "ok")
    assert pod.status.phase == "Succeeded"
    assert pod.spec.node_name.startswith("kwok-cpu-")  # GPU nodes are tainted
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0


def test_labelled_pod_fails_with_exit_code_1(cluster: Cluster, namespace: str) -> None:
    client.BatchV1Api(cluster.api).create_namespaced_job(
        namespace, job_manifest("doomed", labels={"speculators.dev/simulate": "fail"})
    )
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Failed", "job/doomed", "--timeout=90s")
    (pod,) = job_pods(cluster, namespace, "doomed")
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 1


def test_gpu_jobs_land_on_gpu_nodes_and_overcommit_does_not_schedule(cluster: Cluster, namespace: str) -> None:
    nodes = client.CoreV1Api(cluster.api).list_node(label_selector="nvidia.com/gpu.present=true").items
    assert nodes, "no node advertises GPUs"
    per_node = int(nodes[0].status.allocatable["nvidia.com/gpu"])
    assert nodes[0].metadata.labels["nvidia.com/gpu.product"]

    batch = client.BatchV1Api(cluster.api)
    batch.create_namespaced_job(namespace, job_manifest("train", gpus=per_node))
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Complete", "job/train", "--timeout=90s")
    (pod,) = job_pods(cluster, namespace, "train")
    assert pod.spec.node_name in {n.metadata.name for n in nodes}

    batch.create_namespaced_job(namespace, job_manifest("too-big", gpus=per_node + 1))
    cluster.kubectl(
        "wait", "-n", namespace, "--for=create", "pod", "-l", "batch.kubernetes.io/job-name=too-big", "--timeout=60s"
    )
    cluster.kubectl(
        "wait",
        "-n",
        namespace,
        "--for=jsonpath={.status.conditions[0].reason}=Unschedulable",
        "pod",
        "-l",
        "batch.kubernetes.io/job-name=too-big",
        "--timeout=60s",
    )


def test_deployment_gets_ready_replicas(cluster: Cluster, namespace: str) -> None:
    labels = {"app": "web"}
    client.AppsV1Api(cluster.api).create_namespaced_deployment(
        namespace,
        client.V1Deployment(
            metadata=client.V1ObjectMeta(name="web"),
            spec=client.V1DeploymentSpec(
                replicas=3,
                selector=client.V1LabelSelector(match_labels=labels),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels=labels),
                    spec=client.V1PodSpec(containers=[client.V1Container(name="web", image="nginx:1.27")]),
                ),
            ),
        ),
    )
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Available", "deployment/web", "--timeout=90s")
    cluster.kubectl(
        "wait", "-n", namespace, "--for=jsonpath={.status.readyReplicas}=3", "deployment/web", "--timeout=90s"
    )


def _owned_configmap(name: str, owner: dict[str, str]) -> client.V1ConfigMap:
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(
            name=name,
            owner_references=[
                client.V1OwnerReference(
                    api_version=owner["apiVersion"],
                    kind=owner["kind"],
                    name=owner["name"],
                    uid=owner["uid"],
                    controller=True,
                    block_owner_deletion=True,
                )
            ],
        )
    )


def test_owned_object_is_garbage_collected(cluster: Cluster, namespace: str) -> None:
    core = client.CoreV1Api(cluster.api)
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    core.create_namespaced_config_map(
        namespace,
        _owned_configmap(
            "child", {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
        ),
    )
    core.delete_namespaced_config_map("owner", namespace)
    cluster.kubectl("wait", "-n", namespace, "--for=delete", "configmap/child", "--timeout=90s")


def test_object_owned_by_a_custom_resource_is_garbage_collected(
    cluster: Cluster, widget_crd: str, namespace: str
) -> None:
    # what the operator relies on: children owned by its custom resources go with them
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget("parent", size=2))
    uid = cluster.kubectl("get", "-n", namespace, "widget/parent", "-o", "jsonpath={.metadata.uid}").stdout
    client.CoreV1Api(cluster.api).create_namespaced_config_map(
        namespace,
        _owned_configmap("child", {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "name": "parent", "uid": uid}),
    )
    cluster.kubectl("delete", "-n", namespace, "widget/parent")
    # the garbage collector learns new kinds on its discovery resync (every 30 s)
    cluster.kubectl("wait", "-n", namespace, "--for=delete", "configmap/child", "--timeout=120s")


def test_s3_object_is_read_back_with_a_ranged_get(cluster: Cluster) -> None:
    if cluster.s3 is None:
        pytest.skip("the cluster under test came from KUBECONFIG and AWS_ENDPOINT_URL is not set")
    s3 = cluster.s3.client(path_style=True)
    bucket = f"smoke-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    payload = os.urandom(1 << 20)
    s3.put_object(Bucket=bucket, Key="models/draft/model.safetensors", Body=payload)
    part = s3.get_object(Bucket=bucket, Key="models/draft/model.safetensors", Range="bytes=1000-1999")
    assert part["ContentRange"] == f"bytes 1000-1999/{len(payload)}"
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert part["Body"].read() == payload[1000:2000]
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="models/")
    assert [o["Key"] for o in listed["Contents"]] == ["models/draft/model.safetensors"]


def test_helm_installs_and_uninstalls_a_chart(cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    helm = helm_beside(cluster)
    chart = tmp_path / "smoke"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: smoke\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cm\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": str(tmp_path / "hc"),
           "HELM_CONFIG_HOME": str(tmp_path / "hcfg"), "HELM_DATA_HOME": str(tmp_path / "hd")}  # fmt: skip

    def helm_run(*args: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        return out

    helm_run("lint", str(chart))
    helm_run("install", "demo", str(chart), "-n", namespace, "--set", "greeting=hi", "--wait", "--timeout", "60s")
    data = cluster.kubectl("get", "configmap", "demo-cm", "-n", namespace, "-o", "jsonpath={.data.greeting}").stdout
    assert data == "hi"
    helm_run("uninstall", "demo", "-n", namespace, "--wait")
    cluster.kubectl("wait", "-n", namespace, "--for=delete", "configmap/demo-cm", "--timeout=60s")
