"""hf:// sources through the real huggingface_hub client, against a small local stand-in for the hub's
HTTP API (the real hub is not reachable from here): revision resolution to a commit sha, ranged reads
pinned to that sha, and clear errors."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from speculator_operator.checkpoint import CheckpointError, audit, load_checkpoint, load_verifier_config

from ..ckptgen import QWEN3_8B, eagle3, write_checkpoint

SHA = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    def __init__(self, root: Path) -> None:
        self.root = root  # root/<org>/<repo>/<files>
        self.requests: list[tuple[str, str, str | None]] = []


def make_handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:
            hub.requests.append((self.command, self.path, self.headers.get("Range")))
            m = re.fullmatch(r"/api/models/([^/]+)/([^/]+)/revision/([^/?]+).*", self.path)
            if m:
                repo = hub.root / m[1] / m[2]
                if not repo.is_dir() or m[3] not in ("main", SHA):
                    self._send(404, b'{"error":"Repository not found"}', {"X-Error-Code": "RepoNotFound"})
                    return
                info = {"id": f"{m[1]}/{m[2]}", "sha": SHA,
                        "siblings": [{"rfilename": p.name} for p in sorted(repo.iterdir())]}  # fmt: skip
                self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                return
            m = re.fullmatch(r"/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)", self.path)
            if m and m[3] == SHA and (hub.root / m[1] / m[2] / m[4]).is_file():
                path = hub.root / m[1] / m[2] / m[4]
                size = path.stat().st_size
                rng = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
                with path.open("rb") as fh:
                    if rng:
                        start, end = int(rng[1]), min(int(rng[2]), size - 1)
                        fh.seek(start)
                        body = fh.read(end + 1 - start)
                        self._send(206, body, {"Content-Range": f"bytes {start}-{end}/{size}"})
                    else:
                        self._send(200, fh.read())
                return
            self._send(404, b"not found")

        do_HEAD = do_GET

    return Handler


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    state = Hub(tmp_path / "hub")
    state.root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield state
    server.shutdown()


def test_hf_checkpoint_is_read_at_the_resolved_commit(hub: Hub) -> None:
    write_checkpoint(hub.root / "acme" / "qwen3-8b-eagle3", *eagle3())
    write_checkpoint(hub.root / "Qwen" / "Qwen3-8B", QWEN3_8B, {"lm_head.weight": ("BF16", [8, 8])})
    ck = load_checkpoint("hf://acme/qwen3-8b-eagle3@main")
    assert ck.revision == SHA
    reads = [p for m, p, _ in hub.requests if "/resolve/" in p]
    assert reads
    assert all(f"/resolve/{SHA}/" in p for p in reads)  # pinned to the sha, not to "main"
    ranged = [r for m, p, r in hub.requests if p.endswith("model.safetensors")]
    assert len(ranged) == 2
    assert all(r is not None for r in ranged)
    verifier, revision = load_verifier_config("hf://Qwen/Qwen3-8B")
    assert revision == SHA
    report = audit(ck, verifier=verifier, served_verifier="hf://Qwen/Qwen3-8B")
    assert report.ok
    assert [f for f in report.findings if f.rule == "verifier-name"] == []


def test_served_verifier_other_than_recorded_is_a_warning(hub: Hub) -> None:
    write_checkpoint(hub.root / "acme" / "draft", *eagle3())
    report = audit("hf://acme/draft", verifier=QWEN3_8B, served_verifier="hf://RedHatAI/Qwen3-8B-FP8")
    warnings = [f.message for f in report.findings if f.rule == "verifier-name"]
    assert warnings
    assert "'Qwen/Qwen3-8B'" in warnings[0]


def test_unknown_repo_or_revision_is_a_clear_error(hub: Hub) -> None:
    with pytest.raises(CheckpointError, match="hf://acme/missing"):
        load_checkpoint("hf://acme/missing")
    write_checkpoint(hub.root / "acme" / "draft", *eagle3())
    with pytest.raises(CheckpointError, match="hf://acme/draft@v9"):
        load_checkpoint("hf://acme/draft@v9")
    with pytest.raises(CheckpointError, match="expected hf://org/repo"):
        load_checkpoint("hf://just-a-name")
