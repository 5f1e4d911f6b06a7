"""The harness's registry listens where it did last time when it can: podman knows which layers a registry
holds by its host:port, and a push to a new port compresses every layer again to learn its digests."""

from __future__ import annotations

import socket
from pathlib import Path

from speculator_harness import registry
from speculator_harness.process import LOOPBACK, Supervisor


def supervisor(tmp_path: Path) -> Supervisor:
    return Supervisor(tmp_path / "work", tmp_path / "bin", log=lambda _: None)


def test_a_free_remembered_port_is_taken_again(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = registry.stable_port(supervisor(tmp_path), cache)
    assert registry.port_path(cache).read_text().strip() == str(first)
    again = supervisor(tmp_path)
    assert registry.stable_port(again, cache) == first
    assert again.ports[registry.NAME] == first


def test_a_taken_port_or_a_retry_gets_a_new_one_and_remembers_it(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind((LOOPBACK, 0))
        held.listen()  # another process serving there
        taken = held.getsockname()[1]
        registry.port_path(cache).parent.mkdir(parents=True)
        registry.port_path(cache).write_text(f"{taken}\n")
        sup = supervisor(tmp_path)
        port = registry.stable_port(sup, cache)
        assert port != taken
        assert registry.port_path(cache).read_text().strip() == str(port)
        # the supervisor's retry after the port was lost: a fresh one, not the remembered one again
        retried = registry.stable_port(sup, cache)
        assert retried == sup.ports[registry.NAME]
        assert registry.port_path(cache).read_text().strip() == str(retried)


def test_an_unreadable_record_is_a_free_port(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    registry.port_path(cache).parent.mkdir(parents=True)
    registry.port_path(cache).write_text("not a port\n")
    port = registry.stable_port(supervisor(tmp_path), cache)
    assert registry.port_free(port)
