"""Label and annotation keys of the objects the operator makes and reads, one name each (docs/reference/labels.md).
A test fails when another module spells one as a literal."""

from __future__ import annotations

# Kubernetes' recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/common-labels)
NAME_LABEL = "app.kubernetes.io/name"  # every child: speculator-deployment or speculator-trainjob
INSTANCE_LABEL = "app.kubernetes.io/instance"  # every child: its owner's name
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"  # every child: speculator-operator (the watches select on it)
PART_OF_LABEL = "app.kubernetes.io/part-of"  # the CRDs: speculator-operator
# set by the Job controller on an Indexed Job's pods
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"  # read: which rank's log to follow

# ours
DEPLOYMENT_LABEL = "speculators.dev/deployment"  # children of a SpeculatorDeployment: its name
TRAINJOB_LABEL = "speculators.dev/trainjob"  # children of a SpeculatorTrainJob: its name
STAGE_LABEL = "speculators.dev/stage"  # a train job's child: its stage (or server role)
REVISION_LABEL = "speculators.dev/revision"  # serving pods: the coherent revision (label and annotation)
RETRAINS_LABEL = "speculators.dev/retrains"  # a train job a deployment started: the deployment's name
TRACK_LABEL = (
    "speculators.dev/track"  # a canary's Deployment, its selector and its pods: canary (docs/concepts/canary.md)
)
ROLE_LABEL = "speculators.dev/role"  # a multi-node server's pods: leader (API server, /metrics) or worker (headless)
# set by the LeaderWorkerSet controller on its pods (sigs.k8s.io/lws api/leaderworkerset/v1)
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"  # 0: the leader
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"  # the same on every pod of one group
DRAFT_ANNOTATION = "speculators.dev/draft-location"  # serving pods: the exact draft location read
APPLIED_ANNOTATION = "speculators.dev/applied-hash"  # any child: the hash of its rendered form as last applied
# one-shot requests on a SpeculatorDeployment, set by a user or an Argo CD resource action and never written by the
# operator: it acts once on each new value and records the value in status.requests (planning/requests.py)
RESOLVE_REQUEST_ANNOTATION = "speculators.dev/resolve-requested"  # resolve the verifier and draft revisions now
RETRAIN_REQUEST_ANNOTATION = "speculators.dev/retrain-requested"  # retrain the draft for the verifier now
RESUME_REQUEST_ANNOTATION = "speculators.dev/resume-requested"  # roll out a paused verifier or draft change
