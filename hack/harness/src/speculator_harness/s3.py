"""The S3 server (versitygw: SigV4, ranged GETs, multipart), objects as files under the workdir; every
start begins empty. It listens where the API server does: loopback, or the node bridge's gateway address,
so the host (the operator, the tests) and the node's pods use one endpoint value."""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config

from speculator_harness.process import Supervisor

ROOT_ACCESS_KEY = "speculator-local"
ROOT_SECRET_KEY = "speculator-local-secret"  # noqa: S105 - a local test server's fixed credentials


@dataclass
class S3Info:
    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"

    def env(self) -> dict[str, str]:
        """The standard AWS variables that boto3 (and the operator) read."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
        }

    def client(self, path_style: bool = False) -> Any:
        """A boto3 S3 client for this server (path-style addressing on request)."""
        config = Config(s3={"addressing_style": "path"}) if path_style else None
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=config,
        )


def start(sup: Supervisor, address: str) -> S3Info:
    creds = {"ROOT_ACCESS_KEY": ROOT_ACCESS_KEY, "ROOT_SECRET_KEY": ROOT_SECRET_KEY}
    root = sup.workdir / "s3"
    shutil.rmtree(root, ignore_errors=True)
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "meta").mkdir(parents=True, exist_ok=True)

    def argv() -> list[str]:
        port = sup.port("s3")
        return [
            sup.bin("versitygw"),
            f"--port={address}:{port}",
            "posix",
            f"--sidecar={root / 'meta'}",
            str(root / "data"),
        ]

    def ready() -> bool:
        with socket.create_connection((address, sup.ports["s3"]), timeout=1):
            return True

    sup.launch("s3", argv, ready, env=creds)
    return S3Info(f"http://{address}:{sup.ports['s3']}", ROOT_ACCESS_KEY, ROOT_SECRET_KEY)
