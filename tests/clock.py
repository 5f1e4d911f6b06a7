"""The time the tests hand the deciding code: it reads no clock (tests/unit/test_pure_core.py), so a test says when
its pass happens. After every fixture's timestamp but the far-future ones a canary's intervals use."""

from __future__ import annotations

from datetime import UTC, datetime

NOW = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)
