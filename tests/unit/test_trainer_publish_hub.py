"""Publishing to the Hugging Face Hub with the real huggingface_hub client, against a small local
stand-in for the hub's write API (repo creation, preupload, the ndjson commit): one commit holds every
file and the provenance marker, and its message names the verifier revision."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from speculator_operator.api import podcontract
from speculator_operator.domain.checkpoint.manifest import PROVENANCE
from speculator_operator.pods import trainer

from ..ckptgen import SMALL_QWEN3, eagle3, write_checkpoint


class Hub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.commits: list[tuple[str, str, list[str]]] = []  # (repo, summary, paths)


def handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        @property
        def base(self) -> str:
            return f"http://127.0.0.1:{self.server.server_address[1]}"

        def _json(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/api/repos/create":
                req = json.loads(body)
                repo = f"{req.get('organization')}/{req['name']}"
                if repo in hub.repos:
                    self._json(409, {"error": "You already created this model repo"})
                    return
                hub.repos[repo] = {}
                self._json(200, {"url": f"{self.base}/{repo}"})
                return
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/([^/?]+).*", self.path)
            if m:
                files = json.loads(body)["files"]
                self._json(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                           for f in files]})  # fmt: skip
                return
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/([^/?]+).*", self.path)
            if m and m[1] in hub.repos:
                lines = [json.loads(line) for line in body.splitlines() if line.strip()]
                summary = next(x["value"]["summary"] for x in lines if x["key"] == "header")
                paths = []
                for x in lines:
                    if x["key"] == "file":
                        hub.repos[m[1]][x["value"]["path"]] = base64.b64decode(x["value"]["content"])
                        paths.append(x["value"]["path"])
                hub.commits.append((m[1], summary, paths))
                oid = hashlib.sha1(body).hexdigest()  # noqa: S324 - a stand-in commit id
                self._json(200, {"commitUrl": f"{self.base}/{m[1]}/commit/{oid}", "commitOid": oid,
                                 "pullRequestUrl": None})  # fmt: skip
                return
            self._json(404, {"error": f"not in the stand-in: {self.path}"})

    return Handler


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    state = Hub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_TOKEN", "hf_standin")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield state
    server.shutdown()


def test_publish_to_the_hub_is_one_commit_naming_the_verifier(
    hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "report"
    monkeypatch.setenv(podcontract.REPORT_PATH_ENV, str(report))
    # the hub client reads HF_ENDPOINT when it is imported: point its constants at the stand-in
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", os.environ["HF_ENDPOINT"])
    root = tmp_path / "run"
    write_checkpoint(root / "0", *eagle3(SMALL_QWEN3, draft_vocab=1024))
    (root / "checkpoint_best").symlink_to("0")
    code = trainer.publish(str(root), "hf://acme/tiny-draft", "Qwen/Qwen3-8B", "abc123", "ml/q", "2026.11-vllm0.32")
    assert code == 0
    (repo, summary, paths), *more = hub.commits
    assert not more
    assert repo == "acme/tiny-draft"
    assert "Qwen/Qwen3-8B@abc123" in summary
    assert "ml/q" in summary
    assert set(paths) == {"config.json", "model.safetensors", PROVENANCE}
    config = json.loads(hub.repos[repo]["config.json"])
    assert config["speculators_config"]["verifier"]["name_or_path"] == "Qwen/Qwen3-8B"
    out = json.loads(report.read_text())
    assert out["uri"].startswith("hf://acme/tiny-draft@")
    assert json.loads(hub.repos[repo][PROVENANCE])["digest"] == out["digest"]
