"""The operator's settings (runtime/settings.py): one typed value, read once at start from the environment,
each variable checked against its range and named when it is not; no module of the operator process reads the
environment when it is imported; docs/operations/settings.md and the chart say the same names."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from pathlib import Path

import pytest

from speculator_operator.runtime.settings import VARIABLES, Settings, SettingsError

REPO = Path(__file__).resolve().parents[2]


def test_unset_or_empty_variables_give_the_defaults() -> None:
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({v.env: "" for v in VARIABLES.values()}) == Settings()


def test_each_variable_sets_its_field() -> None:
    parsed = Settings.from_env(
        {
            "SPECULATOR_WORKERS": "8",
            "SPECULATOR_QUICK_WORKERS": "0",
            "SPECULATOR_RESYNC_SECONDS": "15",
            "SPECULATOR_SCRAPE_INTERVAL_SECONDS": "0.5",
            "SPECULATOR_SCRAPE_NETWORKS": "127.0.0.0/8, 10.250.0.7/24",
            "SPECULATOR_METRICS_PORT": "9090",
            "SPECULATOR_IMAGE_DIGESTS": '{"r/x:1": "sha256:' + "a" * 64 + '"}',
            "SPECULATOR_DEFAULT_RELEASE": "2026.12-vllm0.34",
            "SPECULATOR_PROFILE_MODE": "census",
        }
    )
    assert (parsed.workers, parsed.quick_workers, parsed.resync_seconds) == (8, 0, 15.0)
    assert parsed.scrape_interval_seconds == 0.5
    assert parsed.scrape_networks == (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("10.250.0.0/24"))
    assert parsed.metrics_port == 9090
    assert parsed.image_digests == {"r/x:1": "sha256:" + "a" * 64}
    assert parsed.images().default_release == "2026.12-vllm0.34"
    assert parsed.profile_mode == "census"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SPECULATOR_WORKERS", "0"),
        ("SPECULATOR_WORKERS", "many"),
        ("SPECULATOR_QUICK_WORKERS", "-1"),
        ("SPECULATOR_PERIODIC_WORKERS", "2000"),
        ("SPECULATOR_RESYNC_SECONDS", "0"),
        ("SPECULATOR_POLL_TICK_SECONDS", "-2"),
        ("SPECULATOR_SCRAPE_TIMEOUT_SECONDS", "nan"),
        ("SPECULATOR_SCRAPE_INTERVAL_SECONDS", "inf"),
        ("SPECULATOR_SCRAPE_MAX_BYTES", "10"),
        ("SPECULATOR_SCRAPE_NETWORKS", "10.0.0.0/8,not-a-network"),
        ("SPECULATOR_METRICS_PORT", "70000"),
        ("SPECULATOR_TRIM_SECONDS", "0"),
        ("SPECULATOR_PROFILE_MODE", "sample"),
        ("SPECULATOR_IMAGE_DIGESTS", "not json"),
    ],
)
def test_a_value_out_of_its_range_is_refused_naming_the_variable_and_the_value(variable: str, value: str) -> None:
    with pytest.raises(SettingsError, match=variable) as refused:
        Settings.from_env({variable: value})
    assert value.split(",")[-1] in str(refused.value)


def test_the_scrape_networks_decide_what_may_be_dialled() -> None:
    anywhere = Settings()
    assert anywhere.dialable("10.1.2.3")
    local = Settings.from_env({"SPECULATOR_SCRAPE_NETWORKS": "127.0.0.0/8"})
    assert local.dialable("127.0.0.5")
    assert not local.dialable("10.1.2.3")
    assert not local.dialable("not-an-address")


# Run in a fresh interpreter: every module of the operator process imported with an environment that records
# who reads it. The pods' code (pods/, api/podcontract.py) runs in the pods and reads theirs; libraries are theirs.
_RECORD = r"""
import os, sys
PACKAGE = os.sep + "speculator_operator" + os.sep
class Recording(dict):
    reads = []
    def _who(self, key):
        caller = sys._getframe(2).f_code.co_filename
        if PACKAGE in caller:
            Recording.reads.append((caller.split(PACKAGE, 1)[1], key))
    def get(self, key, default=None):
        self._who(key)
        return super().get(key, default)
    def __getitem__(self, key):
        self._who(key)
        return super().__getitem__(key)
    def __contains__(self, key):
        self._who(key)
        return super().__contains__(key)
os.environ = Recording(os.environ)
import speculator_operator.cli, speculator_operator.controllers, speculator_operator.runtime.entry
import speculator_operator.runtime.profiling, speculator_operator.runtime.allocator
print(sorted(set(Recording.reads)))
"""


def test_no_module_of_the_operator_process_reads_the_environment_when_imported() -> None:
    out = subprocess.run([sys.executable, "-c", _RECORD], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_docs_table_and_the_chart_name_the_settings() -> None:
    table = (REPO / "docs" / "operations" / "settings.md").read_text()
    documented = set(re.findall(r"^\| `(SPECULATOR_[A-Z_]+)` \|", table, re.MULTILINE))
    assert documented == {v.env for v in VARIABLES.values()}
    chart = (REPO / "charts" / "speculator-operator" / "templates" / "deployment.yaml").read_text()
    for name in re.findall(r"\{name: (SPECULATOR_[A-Z_]+),", chart):
        assert name in documented, f"the chart sets {name}, which the operator does not read"
