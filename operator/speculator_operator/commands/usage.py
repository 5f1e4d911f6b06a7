"""The error every sub-command raises for bad usage or unreadable input: `speculator-operator` prints it as one
line on stderr and exits 2 (cli.py). It lives here, below cli.py, because the sub-commands under commands/ raise it
and may not import the command line that wires them (tests/unit/test_layers.py)."""

from __future__ import annotations


class UsageError(Exception):
    pass
