"""The operator started with an identity the API server refuses a verb it needs: one clear error naming
the verb, the resource and the namespace, exit 4, before any controller starts (not kopf retrying 403s)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from speculator_operator.runtime import permissions

from .conftest import OPERATOR, Cluster, eventually, operator_script

pytestmark = pytest.mark.cluster


def limited_kubeconfig(cluster: Cluster, namespace: str, tmp_path: Path, leave_out: permissions.Check) -> Path:
    """A kubeconfig for a ServiceAccount granted everything the operator uses in `namespace` but `leave_out`."""
    rules = []
    for group, resource, verbs in [*permissions.NEEDED, permissions.LEASES, permissions.PEER_LEASES]:
        kept = [v for v in verbs if (group, resource, v) != (leave_out.group, leave_out.resource, leave_out.verb)]
        if kept:
            rules.append({"apiGroups": [group], "resources": [resource], "verbs": kept})
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "limited"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "limited"},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "limited"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "limited"},
         "subjects": [{"kind": "ServiceAccount", "name": "limited", "namespace": namespace}]},
    ]  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))
    token = cluster.kubectl("create", "token", "limited", "-n", namespace).stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "limited", "user": {"token": token}}],
        "contexts": [{"name": "limited", "context": {"cluster": admin["clusters"][0]["name"], "user": "limited"}}],
        "current-context": "limited",
    }
    path = tmp_path / "limited.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "leave_out",
    [
        permissions.Check("speculators.dev", "speculatordeployments/status", "patch", ""),
        permissions.Check("apps", "deployments", "create", ""),
    ],
    ids=str,
)
def test_a_missing_verb_is_one_clear_error_and_exit_4(
    cluster: Cluster, operator_crds: list[str], namespace: str, tmp_path: Path, leave_out: permissions.Check
) -> None:
    operator_script()
    kubeconfig = limited_kubeconfig(cluster, namespace, tmp_path, leave_out)
    argv = [str(OPERATOR), "run", "--namespace", namespace, "--leader-elect", "--lease-namespace", namespace]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env={"KUBECONFIG": str(kubeconfig),
                         "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 4, out.stdout[-2000:] + out.stderr[-2000:]
    wanted = permissions.Check(leave_out.group, leave_out.resource, leave_out.verb, namespace)
    errors = [line for line in out.stderr.splitlines() if line.startswith("speculator-operator: not allowed to")]
    assert errors == [
        f"speculator-operator: not allowed to {wanted}; grant it to the operator's identity "
        "(the chart's rbac.yaml lists every rule it needs)"
    ], out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "Handler" not in out.stderr  # no controller started


def test_the_same_identity_with_every_verb_runs_the_controllers(
    cluster: Cluster, operator_crds: list[str], namespace: str, tmp_path: Path
) -> None:
    """The control: with nothing left out, the same Role-only identity passes the check, takes the Lease and
    starts the controllers in its namespace; a clean stop exits 0."""
    operator_script()
    kubeconfig = limited_kubeconfig(cluster, namespace, tmp_path, permissions.Check("", "none", "none", ""))
    log = tmp_path / "operator.log"
    argv = [str(OPERATOR), "run", "--namespace", namespace, "--leader-elect", "--lease-namespace", namespace,
            "--identity", "limited"]  # fmt: skip
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env={"KUBECONFIG": str(kubeconfig),
                                "PATH": "/usr/bin:/bin"})  # fmt: skip
        try:

            def started() -> None:
                text = log.read_text()
                assert "Lease" in text, text[-2000:]
                assert "acquired by limited" in text, text[-2000:]
                assert "Activity 'login' succeeded" in text, text[-2000:]

            eventually(started, timeout=90)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert "403" not in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
