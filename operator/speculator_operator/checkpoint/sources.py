"""Where checkpoints live: a local folder, `s3://bucket/prefix`, `hf://org/repo[@revision]`.

Every source reads small files whole (config.json, the shard index) and safetensors files by byte
range only, and counts the bytes and requests it made, so the audit can prove it never downloaded
weights.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from speculator_operator.checkpoint.safetensors_header import HeaderError, header_length

# config.json and the shard index are small; anything bigger is not what we think it is
MAX_SMALL_FILE = 16 * 1024 * 1024


class SourceError(ValueError):
    """The checkpoint (or verifier) location cannot be read; the message says where and why."""


@dataclass
class ReadStats:
    bytes_read: int = 0
    requests: int = 0
    per_file_requests: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, nbytes: int) -> None:
        self.bytes_read += nbytes
        self.requests += 1
        self.per_file_requests[name] = self.per_file_requests.get(name, 0) + 1


class Source(Protocol):
    uri: str
    stats: ReadStats

    @property
    def revision(self) -> str | None: ...

    def exists(self, name: str) -> bool: ...

    def read_small(self, name: str) -> bytes: ...

    def read_range(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        """`length` bytes from `start` (fewer at the end of the file), and the file's total size."""
        ...


def read_header(source: Source, name: str) -> tuple[bytes, int]:
    """The raw JSON header of a safetensors file and the file size: exactly two range reads (the 8-byte
    length, then the header), so not one byte of tensor data is fetched."""
    prefix, size = source.read_range(name, 0, 8)
    n = header_length(prefix, f"{source.uri}/{name}", size)
    raw, _ = source.read_range(name, 8, n)
    if len(raw) != n:
        raise HeaderError(f"{source.uri}/{name}: header truncated ({len(raw)} of {n} bytes)")
    return raw, size


class LocalSource:
    def __init__(self, path: Path) -> None:
        self.root = path
        self.uri = str(path)
        self.stats = ReadStats()
        if not path.is_dir():
            raise SourceError(f"{path}: not a directory" if path.exists() else f"{path}: no such directory")

    @property
    def revision(self) -> str | None:
        return None

    def _path(self, name: str) -> Path:
        return self.root / name

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def read_small(self, name: str) -> bytes:
        path = self._path(name)
        try:
            size = path.stat().st_size
            if size > MAX_SMALL_FILE:
                raise SourceError(f"{path}: {size} bytes, too large for a config file")
            data = path.read_bytes()
        except FileNotFoundError:
            raise SourceError(f"{path}: no such file") from None
        except OSError as exc:
            raise SourceError(f"{path}: {exc.strerror or exc}") from None
        self.stats.count(name, len(data))
        return data

    def read_range(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        path = self._path(name)
        try:
            with path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                fh.seek(start)
                data = fh.read(max(0, min(length, size - start)))
        except FileNotFoundError:
            raise SourceError(f"{path}: no such file") from None
        except OSError as exc:
            raise SourceError(f"{path}: {exc.strerror or exc}") from None
        self.stats.count(name, len(data))
        return data, size


class _RangedSource:
    """A remote source read by HTTP range requests; subclasses fetch one inclusive byte range."""

    uri: str

    def _fetch(self, name: str, start: int, end: int) -> tuple[bytes, int]:
        """Bytes start..end (inclusive) of `name` and its total size; SourceError if it is not there."""
        raise NotImplementedError

    def read_small(self, name: str) -> bytes:
        body, total = self._fetch(name, 0, MAX_SMALL_FILE)
        if total > MAX_SMALL_FILE:
            raise SourceError(f"{self.uri}/{name}: {total} bytes, too large for a config file")
        return body

    def read_range(self, name: str, start: int, length: int) -> tuple[bytes, int]:
        if length <= 0:
            return b"", 0
        return self._fetch(name, start, start + length - 1)


class S3Source(_RangedSource):
    """`s3://bucket/prefix`, read with boto3; the endpoint and keys come from the standard AWS variables."""

    def __init__(
        self, bucket: str, prefix: str, client: Any = None, credentials: Mapping[str, str] | None = None
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.stats = ReadStats()
        self._etags: dict[str, str] = {}
        if client is None:
            import boto3
            from botocore.config import Config

            creds = credentials or {}
            client = boto3.client(
                "s3",
                endpoint_url=creds.get("AWS_ENDPOINT_URL_S3") or creds.get("AWS_ENDPOINT_URL") or None,
                aws_access_key_id=creds.get("AWS_ACCESS_KEY_ID") or None,
                aws_secret_access_key=creds.get("AWS_SECRET_ACCESS_KEY") or None,
                aws_session_token=creds.get("AWS_SESSION_TOKEN") or None,
                region_name=creds.get("AWS_DEFAULT_REGION") or creds.get("AWS_REGION") or None,
                config=Config(retries={"max_attempts": 3, "mode": "standard"}),
            )
        self.client = client

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    @property
    def revision(self) -> str | None:
        """A digest of config.json's ETag: it moves when the checkpoint is replaced."""
        etag = self._etags.get("config.json")
        return None if etag is None else "etag:" + hashlib.sha256(etag.encode()).hexdigest()[:16]

    def _get(self, name: str, range_: str | None = None) -> tuple[bytes, int]:
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(name)}
        if range_:
            kwargs["Range"] = range_
        try:
            resp = self.client.get_object(**kwargs)
            body = resp["Body"].read()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"{self.uri}/{name}") from None
            if code == "InvalidRange":
                return b"", 0
            raise SourceError(f"{self.uri}/{name}: {code or exc}") from None
        except BotoCoreError as exc:
            raise SourceError(f"{self.uri}/{name}: {exc}") from None
        self.stats.count(name, len(body))
        if "ETag" in resp:
            self._etags[name] = resp["ETag"]
        total = len(body)
        content_range = resp.get("ContentRange")
        if content_range:
            match = re.search(r"/(\d+)$", content_range)
            if match:
                total = int(match[1])
        return body, total

    def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError:
            return False
        finally:
            self.stats.requests += 1
        return True

    def _fetch(self, name: str, start: int, end: int) -> tuple[bytes, int]:
        try:
            return self._get(name, f"bytes={start}-{end}")
        except FileNotFoundError:
            raise SourceError(f"{self.uri}/{name}: no such object") from None


class HfSource(_RangedSource):
    """`hf://org/repo[@revision]` through huggingface_hub: the revision is resolved to a commit sha first,
    and every read pins that sha. The hub endpoint and token come from HF_ENDPOINT / HF_TOKEN."""

    def __init__(self, repo_id: str, revision: str | None, credentials: Mapping[str, str] | None = None) -> None:
        from huggingface_hub import HfApi

        creds = credentials or {}
        self.repo_id = repo_id
        self.requested_revision = revision or "main"
        self.uri = f"hf://{repo_id}" + (f"@{revision}" if revision else "")
        self.stats = ReadStats()
        self.api = HfApi(
            endpoint=creds.get("HF_ENDPOINT") or os.environ.get("HF_ENDPOINT") or None,
            token=creds.get("HF_TOKEN") or os.environ.get("HF_TOKEN") or None,
        )
        try:
            info = self.api.model_info(repo_id, revision=self.requested_revision, files_metadata=False)
        except Exception as exc:  # huggingface_hub raises many types: all mean "cannot read it"
            raise SourceError(f"{self.uri}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
        self.stats.requests += 1
        if not info.sha:
            raise SourceError(f"{self.uri}: the hub did not say which commit {self.requested_revision!r} is")
        self.sha: str = info.sha
        self.files = {s.rfilename for s in (info.siblings or [])}

    @property
    def revision(self) -> str | None:
        return self.sha

    def exists(self, name: str) -> bool:
        return name in self.files

    def _url(self, name: str) -> str:
        from huggingface_hub import hf_hub_url

        return str(hf_hub_url(self.repo_id, name, revision=self.sha, endpoint=self.api.endpoint))

    def _get(self, name: str, headers: dict[str, str]) -> tuple[bytes, int]:
        from huggingface_hub import get_session
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

        if name not in self.files:
            raise SourceError(f"{self.uri}: no file {name} at commit {self.sha}")
        all_headers = {**build_hf_headers(token=self.api.token), **headers}
        try:
            resp = get_session().get(self._url(name), headers=all_headers, follow_redirects=True, timeout=30)
        except Exception as exc:
            raise SourceError(f"{self.uri}/{name}: {type(exc).__name__}: {exc}") from None
        if resp.status_code not in (200, 206):
            raise SourceError(f"{self.uri}/{name}: HTTP {resp.status_code}")
        body = resp.content
        self.stats.count(name, len(body))
        total = len(body)
        match = re.search(r"/(\d+)$", resp.headers.get("Content-Range", ""))
        if match:
            total = int(match[1])
        return body, total

    def _fetch(self, name: str, start: int, end: int) -> tuple[bytes, int]:
        return self._get(name, {"Range": f"bytes={start}-{end}"})


def open_source(location: str, credentials: Mapping[str, str] | None = None) -> Source:
    """A Source for a local path, `s3://bucket/prefix` or `hf://org/repo[@revision]`.

    `credentials` (e.g. a Secret's data) take the place of the process environment: AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, HF_TOKEN, HF_ENDPOINT."""
    if location.startswith("s3://"):
        rest = location[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise SourceError(f"{location}: no bucket name")
        return S3Source(bucket, prefix, credentials=credentials)
    if location.startswith("hf://"):
        rest = location[len("hf://") :]
        repo, _, revision = rest.partition("@")
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
            raise SourceError(f"{location}: expected hf://org/repo[@revision]")
        return HfSource(repo, revision or None, credentials)
    if re.match(r"^[a-z][a-z0-9+.-]*://", location):
        raise SourceError(f"{location}: unsupported scheme (use a local path, s3:// or hf://)")
    return LocalSource(Path(location))
