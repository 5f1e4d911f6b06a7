"""Pure: vLLM's Prometheus text -> per-pod, per-revision windows -> acceptance and the SpeculationEffective
condition (acceptance). The scraping itself is controllers/telemetry.py; the evaluate pod reuses the same core."""
