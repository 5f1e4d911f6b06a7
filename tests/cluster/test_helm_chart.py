"""The Helm chart with the built helm, against the real API server."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import config

from speculator_operator.runtime import permissions

from .conftest import REPO, Cluster, helm_beside, missing, node_required

pytestmark = pytest.mark.cluster
CHART = REPO / "charts" / "speculator-operator"


def helm(cluster: Cluster, tmp_path: Path, *args: str) -> str:
    exe = helm_beside(cluster)
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HELM_CACHE_HOME": str(tmp_path / "c"),
           "HELM_CONFIG_HOME": str(tmp_path / "f"), "HELM_DATA_HOME": str(tmp_path / "d")}  # fmt: skip
    out = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_chart_lints_and_renders_into_objects_the_api_server_accepts(
    cluster: Cluster, operator_crds: list[str], namespace: str, tmp_path: Path
) -> None:
    helm(cluster, tmp_path, "lint", str(CHART), "--strict")
    manifest = helm(cluster, tmp_path, "template", "so", str(CHART), "-n", namespace, "--include-crds")
    out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest)
    for kind in ("serviceaccount/so-speculator-operator",
                 "clusterrole.rbac.authorization.k8s.io/so-speculator-operator",
                 "deployment.apps/so-speculator-operator", "customresourcedefinition.apiextensions.k8s.io/"
                 "speculatordeployments.speculators.dev"):  # fmt: skip
        assert kind in out.stdout


def test_installed_chart_grants_what_the_operator_uses_and_no_more(
    cluster: Cluster, operator_crds: list[str], namespace: str, tmp_path: Path
) -> None:
    release = f"so-{namespace[-6:]}"
    fullname = f"{release}-speculator-operator"
    notes = helm(cluster, tmp_path, "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "90s")
    # NOTES.txt: what was installed, how to check it, where the docs are
    assert f"kubectl -n {namespace} rollout status deployment/{fullname}" in notes
    assert f"get lease {fullname}" in notes
    assert f"Service {namespace}/{fullname}-metrics" in notes
    assert "docs/operations/install.md" in notes
    can_i = as_service_account(cluster, namespace, fullname)

    def can(verb: str, resource: str) -> bool:
        return can_i(check_of(verb, resource, "*"))

    # every verb the operator asks for at start (permissions.checks), as the real RBAC authorizer answers
    for check in permissions.checks([], lease_namespace=namespace):
        assert can_i(check), f"the chart does not grant: {check}"
    for verb, resource in [("list", "secrets"), ("create", "pods"), ("delete", "nodes"), ("*", "*"),
                           ("delete", "persistentvolumeclaims"), ("delete", "jobs.batch"),
                           ("delete", "replicasets.apps"), ("get", "leases.coordination.k8s.io"),
                           ("update", "leases.coordination.k8s.io"),
                           ("create", "clusterroles.rbac.authorization.k8s.io")]:  # fmt: skip
        assert not can(verb, resource), f"the operator may {verb} {resource}, which it does not need"
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Available", f"deployment/{fullname}",
                    "--timeout=90s")  # fmt: skip
    helm(cluster, tmp_path, "uninstall", release, "-n", namespace, "--wait")


def test_a_namespaced_install_grants_roles_in_its_namespaces_and_nothing_elsewhere(
    cluster: Cluster, operator_crds: list[str], namespace: str, tmp_path: Path
) -> None:
    other, outside = f"{namespace[:50]}-other", f"{namespace[:50]}-outside"
    for ns in (other, outside):
        cluster.kubectl("create", "namespace", ns)
    release = f"so-{namespace[-6:]}"
    fullname = f"{release}-speculator-operator"
    try:
        helm(
            cluster,
            tmp_path,
            "install",
            release,
            str(CHART),
            "-n",
            namespace,
            "--set",
            f"watchNamespaces={{{namespace},{other}}}",
            "--wait",
            "--timeout",
            "90s",
        )
        can_i = as_service_account(cluster, namespace, fullname)

        def can(verb: str, resource: str, where: str) -> bool:
            return can_i(check_of(verb, resource, where))

        for check in permissions.checks([namespace, other], lease_namespace=namespace):
            assert can_i(check), f"the chart does not grant: {check}"
            verb, resource = check.verb, _resource(check)
            if check.resource == "leases" and verb != "list":  # other releases' Leases are listed where watched
                assert not can(verb, resource, other), f"the operator may {verb} {resource} in {other}"
            assert not can(verb, resource, outside), f"the operator may {verb} {resource} in {outside}"
            assert not can(verb, resource, "*"), f"the operator may {verb} {resource} in every namespace"
        assert not can("list", "namespaces", "*")  # named namespaces: the operator scans nothing cluster-wide
        assert not can("list", "customresourcedefinitions.apiextensions.k8s.io", "*")
        cluster_roles = cluster.kubectl("get", "clusterroles", "-o", "name").stdout
        assert fullname not in cluster_roles
        cluster.kubectl("wait", "-n", namespace, "--for=condition=Available", f"deployment/{fullname}",
                        "--timeout=90s")  # fmt: skip
        helm(cluster, tmp_path, "uninstall", release, "-n", namespace, "--wait")
    finally:
        for ns in (other, outside):
            cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _resource(check: permissions.Check) -> str:
    resource = check.resource.split("/")[0]
    return f"{resource}.{check.group}" if check.group else resource


def as_service_account(cluster: Cluster, namespace: str, account: str) -> Callable[[permissions.Check], bool]:
    """Whether the chart's service account may do a check, as the API server's authorizer answers it: the
    operator's own start-up review (a SelfSubjectAccessReview), made as that account through impersonation,
    which is what `kubectl auth can-i --as` sends, one request a check instead of one kubectl process."""
    api = config.new_client_from_config(str(cluster.kubeconfig))
    api.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:{account}")
    return lambda check: not permissions.missing(api, [check])


def check_of(verb: str, resource: str, where: str) -> permissions.Check:
    """`kubectl auth can-i` words (`jobs.batch`, `*` for every namespace) as a permissions.Check."""
    name, _, group = resource.partition(".")
    return permissions.Check(group, name, verb, "" if where == "*" else where)


PROMTOOL = "/usr/bin/promtool"


def promtool(tmp_path: Path, *args: str) -> str:
    if not os.access(PROMTOOL, os.X_OK):
        missing(f"no {PROMTOOL} (Debian's prometheus package; hack/test installs it as root)", node_required())
    out = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_monitoring_objects_render_and_promtool_checks_the_alerts_and_the_dashboards_queries(
    cluster: Cluster, tmp_path: Path
) -> None:
    flags = [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.dashboard.enabled=true",
    ]
    helm(cluster, tmp_path, "lint", str(CHART), "--strict", *flags)
    docs = [
        d for d in yaml.safe_load_all(helm(cluster, tmp_path, "template", "so", str(CHART), "-n", "mon", *flags)) if d
    ]
    by_kind = {d["kind"]: d for d in docs}
    assert by_kind["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "metrics"
    service = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics"))
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    # the alert rules, as Prometheus reads them: checked, then tested on scripted series
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": by_kind["PrometheusRule"]["spec"]["groups"]}))
    promtool(tmp_path, "check", "rules", "rules.yaml")
    summary = "Speculation on ml/qwen costs more than it saves"
    description = (
        "Predicted speedup 0.80x: the measured acceptance is below break-even. Retrain the draft for this "
        "verifier, lower K, or serve without it (kubectl describe sdep shows SpeculationEffective)."
    )
    tests = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'speculator_predicted_speedup{namespace="ml",name="qwen"}', "values": "0.8x30"},
                    {"series": 'speculator_predicted_speedup{namespace="ml",name="fine"}', "values": "2.4x30"},
                    {"series": 'speculator_predicted_speedup{namespace="ml",name="brief"}', "values": "0.5x3 2x27"},
                    # a canary rejected at minute 10; another one promoted: only the rejection alerts
                    {
                        "series": 'speculator_canary_verdicts_total{namespace="ml",name="qwen",verdict="RolledBack"}',
                        "values": "0x10 1x20",
                    },
                    {
                        "series": 'speculator_canary_verdicts_total{namespace="ml",name="fine",verdict="Promoted"}',
                        "values": "0x10 1x20",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "SpeculationBelowBreakEven", "exp_alerts": []},
                    {
                        "eval_time": "20m",
                        "alertname": "SpeculationBelowBreakEven",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", "namespace": "ml", "name": "qwen"},
                                "exp_annotations": {"summary": summary, "description": description},
                            }
                        ],
                    },
                    {"eval_time": "5m", "alertname": "SpeculatorCanaryRolledBack", "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": "SpeculatorCanaryRolledBack",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "warning",
                                    "namespace": "ml",
                                    "name": "qwen",
                                    "verdict": "RolledBack",
                                },
                                "exp_annotations": {
                                    "summary": "The canary of a new draft on ml/qwen was rolled back",
                                    "description": "Its live acceptance fell below the incumbent's beyond the margin; "
                                    "the incumbent serves on. kubectl get sdep qwen -n ml -o "
                                    "jsonpath='{.status.canary.message}' gives both figures.",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    promtool(tmp_path, "test", "rules", "tests.yaml")
    # the dashboard: valid JSON whose every query is valid PromQL (checked as recording rules)
    dashboard = json.loads(by_kind["ConfigMap"]["data"]["speculator-operator.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 7
    metrics_named = {m for e in exprs for m in re.findall(r"speculator_[a-z_]+", e)}
    assert metrics_named >= {
        "speculator_acceptance_rate",
        "speculator_acceptance_per_position",
        "speculator_predicted_speedup",
        "speculator_requests_running",
    }
    concrete = [e.replace("$namespace", ".*").replace("$deployment", ".*") for e in exprs]
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(concrete)]}
        ]
    }
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules))
    promtool(tmp_path, "check", "rules", "dashboard-rules.yaml")
