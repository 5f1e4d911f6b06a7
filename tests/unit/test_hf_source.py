"""hf:// sources through the real huggingface_hub client, against a small local stand-in for the hub's
HTTP API (the real hub is not reachable from here): revision resolution to a commit sha, ranged reads
pinned to that sha, and clear errors."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from speculator_operator.adapters.checkpoints import audit, load_checkpoint, load_verifier_config
from speculator_operator.domain.checkpoint import CheckpointError, Manifest
from speculator_operator.pods.stage import stage

from ..ckptgen import QWEN3_8B, SMALL_QWEN3, eagle3, write_checkpoint

SHA = "0123456789abcdef0123456789abcdef01234567"


def sibling(path: Path) -> dict[str, object]:
    """A file as the hub lists it with blobs=true: git blob id, size, and LFS metadata for large files."""
    size = path.stat().st_size
    # the real ids where the file is small; the big sparse test checkpoints get an id from their name and size
    data = path.read_bytes() if size < 64 << 20 else f"{path.name}:{size}".encode()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's blob id
    out: dict[str, object] = {"rfilename": path.name, "blobId": blob, "size": size}
    if path.suffix == ".safetensors":
        out["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
    return out


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
                info = {"id": f"{m[1]}/{m[2]}", "sha": SHA, "siblings": [sibling(p) for p in sorted(repo.iterdir())]}
                self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                return
            m = re.fullmatch(r"/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)", self.path)
            if m and m[3] == SHA and (hub.root / m[1] / m[2] / m[4]).is_file():
                path = hub.root / m[1] / m[2] / m[4]
                size = path.stat().st_size
                meta = sibling(path)
                identity = meta["lfs"]["sha256"] if "lfs" in meta else meta["blobId"]
                if self.command == "HEAD" or not self.headers.get("Range"):
                    headers = {"X-Repo-Commit": SHA, "ETag": f'"{identity}"', "Content-Length": str(size)}
                    if "lfs" in meta:
                        headers.update({"X-Linked-Etag": f'"{identity}"', "X-Linked-Size": str(size)})
                    self.send_response(200)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(path.read_bytes())
                    return
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


def test_a_hub_draft_names_its_files_and_the_pod_stages_exactly_those(hub: Hub, tmp_path: Path) -> None:
    repo = hub.root / "acme" / "draft"
    write_checkpoint(repo, *eagle3(SMALL_QWEN3, draft_vocab=1024), sparse=False)
    (repo / "README.md").write_text("# a draft")
    ck = load_checkpoint("hf://acme/draft")
    assert ck.manifest is not None
    assert ck.manifest.names == ["config.json", "model.safetensors"]  # the README is not read by vLLM
    weights = ck.manifest.get("model.safetensors")
    assert weights is not None
    assert weights.sha256 == hashlib.sha256((repo / "model.safetensors").read_bytes()).hexdigest()
    assert stage("hf://acme/draft", str(tmp_path / "a"), ck.revision, ck.manifest.to_arg()) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if not p.name.startswith(".")) == ck.manifest.names
    # bytes that are not the audited ones (another sha256 than the list says) are refused, naming the file
    wrong = Manifest.of(replace(f, sha256="0" * 64) if f.sha256 else f for f in ck.manifest.files)
    assert stage("hf://acme/draft", str(tmp_path / "b"), ck.revision, wrong.to_arg()) == 1
