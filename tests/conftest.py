"""Shared test configuration: tiers are folders (tests/unit, tests/cluster)."""
