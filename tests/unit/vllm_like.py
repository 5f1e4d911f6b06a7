"""A server that answers like vLLM's OpenAI server where the in-pod clients talk to it (the evaluate and sweep
clients' unit tests): /health, /metrics from `metrics()`, and /v1/completions, whose completion tokens come from
`complete(body)`. Subclasses script the counters."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from speculator_harness.cluster import free_port


class VllmLike:
    def __init__(self) -> None:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: str, kind: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # http.server's name
                if self.path == "/health":
                    self._send(200, "")
                elif self.path == "/metrics":
                    self._send(200, stand_in.metrics())
                else:
                    self._send(404, "")

            def do_POST(self) -> None:  # http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                tokens = stand_in.complete(body)
                answer = {"choices": [{"text": "x"}], "usage": {"completion_tokens": tokens}}
                self._send(200, json.dumps(answer), "application/json")

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def metrics(self) -> str:
        raise NotImplementedError

    def complete(self, body: dict[str, Any]) -> int:
        """The completion tokens of one request."""
        raise NotImplementedError

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
