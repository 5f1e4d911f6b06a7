"""The capture in the serving pod (docs/concepts/learning.md#capture-in-the-pod): an ASGI middleware vLLM's API server
loads with `--middleware speculator_operator.pods.capture.middleware.Capture` that samples the requests it answers,
keeps the on-policy ones as pretokenized rows, and writes them in shards to the deployment's storage, off the
request path. policy (pure: what is eligible, the row), wire (pure: the response bytes restored), config (the
settings, read live), spool (the bounded queue and its writer thread), metrics (the counters /metrics serves)."""
