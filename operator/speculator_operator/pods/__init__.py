"""Runs inside the pods the operator renders, never in the operator process: staging checkpoints into a pod
(stage), auditing and starting vLLM (serve), the train job's stages (trainer/), the evaluate stage's client
(evaluate, holdout) and the progress line a stage prints (progress). What they hand the operator is the pod
contract, api/podcontract.py; the images add what they need (torch, speculators, vLLM)."""
