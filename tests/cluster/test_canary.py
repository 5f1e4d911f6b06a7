"""A canary on the real control plane with scripted vLLM metrics (standin.py): a new draft runs as NAME-canary
beside the incumbent; one whose live α matches the incumbent's is promoted with exactly one rollout of the main
Deployment, one 0.5 below is rolled back with none; the Service never selects a pod of a third revision; an
operator restart between two intervals neither restarts the analysis nor counts an interval twice.

Rollouts are counted by the main Deployment's generation: every new pod template (or scale) moves it by one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from speculator_operator.api.labels import REVISION_LABEL, TRACK_LABEL

from .conftest import Cluster, eventually, get, sdep
from .standin import StandIn, standin_node  # noqa: F401  (standin_node: a fixture)
from .test_revisions import bucket_of, draft, upload
from .test_tuning import operator_in

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("operator_crds", "standin_node")]

INTERVAL = 10  # the shortest interval the API takes; the operator scrapes each second here
POLICY = {"intervalSeconds": INTERVAL, "minDrafts": 200, "promoteAfter": 2, "rollbackAfter": 2, "maxFailures": 3}
# figures per side: the candidate's α, the incumbent's
SCRIPT = {"promo": (0.7, 0.7), "reject": (0.3, 0.8)}


def status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return get(cluster, namespace, f"sdep/{name}")["status"]  # type: ignore[no-any-return]


def generation(cluster: Cluster, namespace: str, name: str) -> int:
    return int(get(cluster, namespace, f"deployment/{name}")["metadata"]["generation"])


def conds(st: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in st.get("conditions") or []}


def pods_of(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
    return [p for p in json.loads(out.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]


def selected_revisions(cluster: Cluster, namespace: str, name: str) -> set[str]:
    """The revisions of the pods the Service selects now."""
    selector = get(cluster, namespace, f"service/{name}")["spec"]["selector"]
    assert TRACK_LABEL not in selector  # both tracks
    pods = pods_of(cluster, namespace, ",".join(f"{k}={v}" for k, v in selector.items()))
    return {p["metadata"]["labels"][REVISION_LABEL] for p in pods}


def stand_in(cluster: Cluster, namespace: str, selector: str, k: int, alpha: float) -> StandIn:
    """A stand-in at the one live pod `selector` picks (kwok gives the stand-in node's pods 127.1.0.x)."""

    def one() -> dict[str, Any]:
        pods = pods_of(cluster, namespace, selector)
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        assert pods[0]["status"].get("podIP", "").startswith("127.1.0."), pods[0]["status"]
        return pods[0]

    made = StandIn(eventually(one, timeout=60)["status"]["podIP"], k)
    made.mode, made.alpha = "alpha", alpha
    return made


def verdicts(namespace: str, name: str, verdict: str) -> float:
    said = REGISTRY.get_sample_value(
        "speculator_canary_verdicts_total", {"namespace": namespace, "name": name, "verdict": verdict}
    )
    return said or 0.0


def test_a_canary_promotes_a_matching_draft_and_rolls_back_a_worse_one_across_an_operator_restart(
    cluster: Cluster, store: dict[str, str], namespace: str, creds: str, s3: Any, tmp_path: Path
) -> None:
    new_draft = f"s3://{bucket_of(store['verifier'])}/canary-{namespace}"
    upload(s3, draft(tmp_path / "new", b"\x02"), new_draft)
    serving = {"replicas": 1, "nodeSelector": {"speculators.dev/standin": "true"}}
    fakes: list[StandIn] = []
    before: dict[str, dict[str, Any]] = {}
    try:
        with operator_in(cluster, namespace):
            for name in SCRIPT:
                doc = json.loads(sdep(name, store, "good", creds, **serving))
                doc["spec"]["upgradePolicy"] = {"canary": POLICY}
                cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
            for name, (_, inc) in SCRIPT.items():
                cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", f"sdep/{name}", "--timeout=120s")
                st = status(cluster, namespace, name)
                k = st["numSpeculativeTokens"]
                fakes.append(stand_in(cluster, namespace, f"speculators.dev/deployment={name}", k, inc))
                before[name] = {"status": st, "generation": generation(cluster, namespace, name), "k": k}
                # a new draft, the verifier unchanged: a canary, not a rollout
                patch = {"spec": {"speculator": {"source": new_draft}}}
                cluster.kubectl("patch", "-n", namespace, f"sdep/{name}", "--type=merge", "-p", json.dumps(patch))

            for name, (cand, _) in SCRIPT.items():

                def analyzing(name: str = name) -> dict[str, Any]:
                    st = status(cluster, namespace, name)
                    assert (st.get("canary") or {}).get("state") == "Analyzing", st.get("canary")
                    return st

                st = eventually(analyzing, timeout=90)
                incumbent = before[name]["status"]
                assert st["revision"] == incumbent["revision"]
                assert st["draftRevision"] == incumbent["draftRevision"]
                assert st["canary"]["candidate"]["revision"] != incumbent["revision"]
                assert st["canary"]["k"] == before[name]["k"]
                assert conds(st)["Reconciling"] == ("True", "CanaryAnalyzing")
                assert conds(st)["DraftCurrent"] == ("False", "CanaryAnalyzing")
                assert conds(st)["Ready"] == ("True", "Ready")
                canary = get(cluster, namespace, f"deployment/{name}-canary")
                assert canary["spec"]["replicas"] == 1
                assert canary["spec"]["selector"]["matchLabels"][TRACK_LABEL] == "canary"
                selector = f"speculators.dev/deployment={name},{TRACK_LABEL}=canary"
                fakes.append(stand_in(cluster, namespace, selector, before[name]["k"], cand))
                before[name]["candidate"] = st["canary"]["candidate"]["revision"]

            def one_interval_each() -> None:
                for name in SCRIPT:
                    counts = status(cluster, namespace, name)["canary"].get("counts") or {}
                    assert counts.get("passed", 0) + counts.get("failed", 0) == 1, counts

            eventually(one_interval_each, timeout=3 * INTERVAL)
            held = {name: status(cluster, namespace, name)["canary"] for name in SCRIPT}
            assert held["promo"]["lastInterval"] == "Pass"
            assert held["reject"]["lastInterval"] == "Fail"
            for name in SCRIPT:
                assert selected_revisions(cluster, namespace, name) <= {before[name]["status"]["revision"],
                                                                        before[name]["candidate"]}  # fmt: skip

        # the operator restarts between two intervals: the counts stand, the next interval is the second
        for name in SCRIPT:
            assert status(cluster, namespace, name)["canary"]["counts"] == held[name]["counts"]
        with operator_in(cluster, namespace):

            def promoted() -> dict[str, Any]:
                st = status(cluster, namespace, "promo")
                assert st["canary"]["state"] == "Promoted", st["canary"]
                assert conds(st)["Ready"] == ("True", "Ready")
                return st

            def rejected() -> dict[str, Any]:
                st = status(cluster, namespace, "reject")
                assert st["canary"]["state"] == "RolledBack", st["canary"]
                return st

            promo = eventually(promoted, timeout=4 * INTERVAL)
            reject = eventually(rejected, timeout=2 * INTERVAL)
            assert verdicts(namespace, "promo", "Promoted") == 1
            assert verdicts(namespace, "reject", "RolledBack") == 1

        # promoted: one rollout of the main Deployment, to the candidate; the canary's Deployment is gone
        assert promo["canary"]["counts"]["passed"] == POLICY["promoteAfter"]  # no interval counted twice
        assert promo["canary"]["analyzedUntil"] > held["promo"]["analyzedUntil"]
        assert promo["revision"] == before["promo"]["candidate"]
        assert promo["draftRevision"] != before["promo"]["status"]["draftRevision"]
        assert conds(promo)["DraftCurrent"] == ("True", "RevisionResolved")
        assert "Reconciling" not in conds(promo)
        assert generation(cluster, namespace, "promo") == before["promo"]["generation"] + 1
        main = get(cluster, namespace, "deployment/promo")
        assert main["spec"]["template"]["metadata"]["annotations"][REVISION_LABEL] == promo["revision"]
        eventually(lambda: _gone(cluster, namespace, "deployment/promo-canary"), timeout=30)

        # rejected: no rollout at all, the canary gone, the incumbent serves with both figures said
        assert reject["canary"]["counts"]["failed"] == POLICY["rollbackAfter"]
        assert reject["revision"] == before["reject"]["status"]["revision"]
        assert reject["draftRevision"] == before["reject"]["status"]["draftRevision"]
        assert generation(cluster, namespace, "reject") == before["reject"]["generation"]
        assert conds(reject)["DraftCurrent"] == ("False", "CanaryRejected")
        assert conds(reject)["Ready"] == ("True", "Ready")
        assert "Reconciling" not in conds(reject)
        assert "Stalled" not in conds(reject)
        said = next(c["message"] for c in reject["conditions"] if c["type"] == "DraftCurrent")
        assert str(reject["canary"]["candidate"]["alpha"]) in said
        assert str(reject["canary"]["incumbent"]["alpha"]) in said
        assert reject["canary"]["candidate"]["alpha"] < reject["canary"]["incumbent"]["alpha"] - 0.4
        eventually(lambda: _gone(cluster, namespace, "deployment/reject-canary"), timeout=30)
        assert selected_revisions(cluster, namespace, "reject") == {reject["revision"]}
        reasons = [
            (e["involvedObject"]["name"], e["type"], e["reason"]) for e in get(cluster, namespace, "events")["items"]
        ]
        assert ("promo", "Normal", "CanaryPromoted") in reasons
        assert ("reject", "Warning", "CanaryRejected") in reasons
        assert sum(1 for r in reasons if r[2] == "CanaryStarted") == 2  # the restart started nothing again
    finally:
        for f in fakes:
            f.close()


def _gone(cluster: Cluster, namespace: str, what: str) -> None:
    done = cluster.kubectl("get", "-n", namespace, what, "--ignore-not-found", "-o", "name", check=False)
    assert done.stdout.strip() == "", done.stdout
