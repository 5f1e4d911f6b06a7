"""Where checkpoints live, read: a local folder, `s3://bucket/prefix`, `hf://org/repo[@revision]` (the stores
behind domain/checkpoint/sources.py's `Source`; the shell opens them, the audit reads through them).

Every source reads small files whole (config.json, the shard index) and safetensors files by byte
range only, and counts the bytes and requests it made, so the audit can prove it never downloaded
weights. Each also says what the checkpoint is made of (checkpoint/manifest.py) from a listing: an
s3:// prefix is listed once (ListObjectsV2), every read is pinned to the listed ETag (If-Match), and
the revision is the digest of that listing; a hub repo is one model_info call at a commit sha.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speculator_operator.domain.checkpoint.manifest import (
    CONFIG,
    LATEST,
    PROVENANCE,
    FileEntry,
    Kind,
    Manifest,
    hub_content,
    s3_content,
    s3_revision,
    select,
)
from speculator_operator.domain.checkpoint.sources import (
    MAX_SMALL_FILE,
    ReadStats,
    Source,
    SourceError,
    pointer_target,
)
from speculator_operator.domain.location import Location


class LocalSource:
    def __init__(self, path: Path, kind: Kind = "draft") -> None:
        self.root = path
        self.uri = str(path)
        self.kind = kind
        self.resolved_from: str | None = None
        self.stats = ReadStats()
        if not path.is_dir():
            raise SourceError(f"{path}: not a directory" if path.exists() else f"{path}: no such directory")
        if kind == "draft" and not (path / CONFIG).exists() and (path / LATEST).is_file():
            name = pointer_target(self.read_small(LATEST), f"{path}/{LATEST}")
            self.resolved_from, self.root, self.uri = self.uri, path / name, str(path / name)

    @property
    def revision(self) -> str | None:
        return None

    @property
    def content(self) -> str | None:
        return None

    @property
    def manifest(self) -> Manifest | None:
        """Names and sizes (a folder has no store identity: the etag is empty)."""
        sizes = {p.name: ("", p.stat().st_size) for p in self.root.iterdir() if p.is_file()}
        return Manifest.from_listing(sizes, self.kind)

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
    """`s3://bucket/prefix`, read with boto3; the endpoint and keys come from the standard AWS variables.

    The prefix is listed once; a draft prefix that holds no config.json but a `speculators-latest.json`
    pointer (what a train job's publish leaves at its output.uri) is read through it: the checkpoint is
    the exact location the pointer names. Every read carries If-Match with the listed ETag, so the bytes
    audited are the bytes the revision names (a replaced object fails the read instead)."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        client: Any = None,
        credentials: Mapping[str, str] | None = None,
        kind: Kind = "draft",
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = self._uri(self.prefix)
        self.kind = kind
        self.resolved_from: str | None = None
        self.stats = ReadStats()
        self._objects: dict[str, tuple[str, int]] | None = None
        self.client = client if client is not None else s3_client(credentials)

    def _uri(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def key(self, name: str) -> str:
        """The object key of a file of this checkpoint."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def listing(self) -> dict[str, tuple[str, int]]:
        """{name: (ETag without quotes, size)} of the objects directly under the prefix (one request per
        1,000 objects), following a `speculators-latest.json` pointer once."""
        if self._objects is None:
            self._objects = self._list()
            if self.kind == "draft" and CONFIG not in self._objects and LATEST in self._objects:
                self._follow(self._objects[LATEST][0])
        return self._objects

    def _list(self) -> dict[str, tuple[str, int]]:
        from botocore.exceptions import BotoCoreError, ClientError

        base = f"{self.prefix}/" if self.prefix else ""
        found: dict[str, tuple[str, int]] = {}
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base, Delimiter="/"
            )
            for page in pages:
                self.stats.requests += 1
                for obj in page.get("Contents", []):
                    name = obj["Key"][len(base) :]
                    if name:
                        found[name] = (str(obj.get("ETag", "")).strip('"'), int(obj.get("Size", 0)))
        except ClientError as exc:
            raise SourceError(f"{self.uri}: {exc.response.get('Error', {}).get('Code', '') or exc}") from None
        except BotoCoreError as exc:
            raise SourceError(f"{self.uri}: {exc}") from None
        return found

    def _follow(self, etag: str) -> None:
        """Re-point this source at the exact location a `speculators-latest.json` pointer names."""
        try:
            raw, _ = self._get(LATEST, None, etag)
        except FileNotFoundError:
            raise SourceError(f"{self.uri}/{LATEST}: deleted while it was being read; read it again") from None
        name = pointer_target(raw, f"{self.uri}/{LATEST}")
        self.resolved_from = self.uri
        self.prefix = f"{self.prefix}/{name}" if self.prefix else name
        self.uri = self._uri(self.prefix)
        self._objects = self._list()

    @property
    def manifest(self) -> Manifest:
        return Manifest.from_listing(self.listing(), self.kind)

    @property
    def revision(self) -> str | None:
        """The digest of every file that makes up the checkpoint (name, ETag, size): it moves when any of
        them is replaced, added or removed."""
        return s3_revision(self.manifest)

    @property
    def content(self) -> str | None:
        return s3_content(self.manifest)

    def _get(self, name: str, range_: str | None, etag: str | None) -> tuple[bytes, int]:
        """The object's bytes (a range of them) and its size, provided it still has the listed ETag."""
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": self.key(name)}
        if range_:
            kwargs["Range"] = range_
        if etag:
            kwargs["IfMatch"] = f'"{etag}"'
        try:
            resp = self.client.get_object(**kwargs)
            body = resp["Body"].read()
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"{self.uri}/{name}") from None
            if code == "InvalidRange":
                return b"", 0
            if code in ("PreconditionFailed", "412"):
                message = f"replaced while it was being read (its ETag is no longer {etag}); read it again"
                raise SourceError(f"{self.uri}/{name}: {message}") from None
            raise SourceError(f"{self.uri}/{name}: {code or exc}") from None
        except BotoCoreError as exc:
            raise SourceError(f"{self.uri}/{name}: {exc}") from None
        self.stats.count(name, len(body))
        total = len(body)
        content_range = resp.get("ContentRange")
        if content_range:
            match = re.search(r"/(\d+)$", content_range)
            if match:
                total = int(match[1])
        return body, total

    def exists(self, name: str) -> bool:
        return name in self.listing()

    def _fetch(self, name: str, start: int, end: int) -> tuple[bytes, int]:
        listed = self.listing().get(name)
        if listed is None:
            raise SourceError(f"{self.uri}/{name}: no such object")
        try:
            return self._get(name, f"bytes={start}-{end}", listed[0])
        except FileNotFoundError:
            raise SourceError(f"{self.uri}/{name}: no such object (deleted after the listing)") from None


S3_KEYS = (  # what a Secret for s3:// may hold, and the environment fills in where it does not
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
)


def s3_client(credentials: Mapping[str, str] | None = None) -> Any:
    """A boto3 S3 client from a Secret's AWS_* keys (or the process environment where a key is absent). One
    per set of credentials, kept: making a client costs more CPU than the ranged reads an audit makes, and
    the operator audits with the same few Secrets over and over (a rotated Secret is a new key; so is a
    changed environment, read here rather than left to boto3 at the client's making)."""
    creds = credentials or {}
    key = tuple(creds.get(k) or os.environ.get(k) or None for k in S3_KEYS)
    # one maker at a time: a burst of audits on many threads would otherwise each make the same client, and
    # each making decodes botocore's JSON service models anew (measured: 288 MiB of them at once at 100
    # resources, which the process's resident set kept)
    with _making:
        return _s3_client(key)


_making = threading.Lock()


class PlainJSONFileLoader:
    """botocore's file-loader interface (`exists`, `load_file`: a path without its .json or .json.gz) that
    decodes the service models into plain dicts. botocore's own JSONFileLoader decodes them into OrderedDicts
    (ordered dicts were not the language's when it was written): S3's model and the endpoint tables are
    12 MiB so, 8 MiB as dicts, and the operator keeps its clients for its whole life
    (docs/operations/memory.md has the measurement)."""

    SUFFIXES = ((".json", open), (".json.gz", gzip.open))

    def exists(self, file_path: str) -> bool:
        return any(os.path.isfile(file_path + suffix) for suffix, _ in self.SUFFIXES)

    def load_file(self, file_path: str) -> Any:
        for suffix, opener in self.SUFFIXES:
            if os.path.isfile(file_path + suffix):
                with opener(file_path + suffix, "rb") as fp:
                    return json.loads(fp.read().decode("utf-8"))
        return None


def botocore_session() -> Any:
    """A botocore session whose service models load as plain dicts (PlainJSONFileLoader), through botocore's
    public Loader with the search path botocore itself would use (AWS_DATA_PATH included)."""
    import botocore.session
    from botocore.loaders import Loader

    session = botocore.session.Session()
    data_path = session.get_config_variable("data_path")
    extra = [os.path.expanduser(os.path.expandvars(p)) for p in data_path.split(os.pathsep)] if data_path else None
    session.register_component("data_loader", Loader(extra_search_paths=extra, file_loader=PlainJSONFileLoader()))
    return session


@functools.lru_cache(maxsize=64)
def _s3_client(values: tuple[str | None, ...]) -> Any:
    import boto3
    from botocore.config import Config

    creds = {k: v for k, v in zip(S3_KEYS, values, strict=True) if v}
    return boto3.session.Session(botocore_session=botocore_session()).client(
        "s3",
        endpoint_url=creds.get("AWS_ENDPOINT_URL_S3") or creds.get("AWS_ENDPOINT_URL") or None,
        aws_access_key_id=creds.get("AWS_ACCESS_KEY_ID") or None,
        aws_secret_access_key=creds.get("AWS_SECRET_ACCESS_KEY") or None,
        aws_session_token=creds.get("AWS_SESSION_TOKEN") or None,
        region_name=creds.get("AWS_DEFAULT_REGION") or creds.get("AWS_REGION") or None,
        # as many connections as the operator's handler threads may read with at once
        config=Config(retries={"max_attempts": 3, "mode": "standard"}, max_pool_connections=48),
    )


class HfSource(_RangedSource):
    """`hf://org/repo[@revision]` through huggingface_hub: the revision is resolved to a commit sha first,
    and every read pins that sha. The hub endpoint and token come from HF_ENDPOINT / HF_TOKEN."""

    def __init__(
        self, repo_id: str, revision: str | None, credentials: Mapping[str, str] | None = None, kind: Kind = "draft"
    ) -> None:
        from huggingface_hub import HfApi

        creds = credentials or {}
        self.kind = kind
        self.resolved_from: str | None = None
        self.repo_id = repo_id
        self.requested_revision = revision or "main"
        self.uri = f"hf://{repo_id}" + (f"@{revision}" if revision else "")
        self.stats = ReadStats()
        self.api = HfApi(
            endpoint=creds.get("HF_ENDPOINT") or os.environ.get("HF_ENDPOINT") or None,
            token=creds.get("HF_TOKEN") or os.environ.get("HF_TOKEN") or None,
        )
        try:
            info = self.api.model_info(repo_id, revision=self.requested_revision, files_metadata=True)
        except Exception as exc:  # huggingface_hub raises many types: all mean "cannot read it"
            raise SourceError(f"{self.uri}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
        self.stats.requests += 1
        if not info.sha:
            raise SourceError(f"{self.uri}: the hub did not say which commit {self.requested_revision!r} is")
        self.sha: str = info.sha
        self.files = {s.rfilename for s in (info.siblings or [])}
        entries = {}
        for s in info.siblings or []:
            lfs = s.lfs
            identity = (lfs.sha256 if lfs else None) or s.blob_id or ""
            size = s.size or (lfs.size if lfs else 0) or 0
            entries[s.rfilename] = FileEntry(s.rfilename, identity, size, lfs.sha256 if lfs else None)
        self._manifest = Manifest.of(entries[n] for n in select(entries, kind))

    @property
    def revision(self) -> str | None:
        return self.sha

    @property
    def content(self) -> str | None:
        return hub_content(self._manifest)

    @property
    def manifest(self) -> Manifest:
        """The files at the commit, with the blob id (the LFS sha256 for large files) and size."""
        return self._manifest

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


def open_source(location: str, credentials: Mapping[str, str] | None = None, kind: Kind = "draft") -> Source:
    """A Source for a local path, `s3://bucket/prefix` or `hf://org/repo[@revision]`, holding a checkpoint
    of this kind (which files make it up: checkpoint/manifest.py).

    `credentials` (e.g. a Secret's data) take the place of the process environment: AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, HF_TOKEN, HF_ENDPOINT."""
    where = Location.parse(location)
    if where.is_s3:
        if not where.root:
            raise SourceError(f"{location}: no bucket name")
        return S3Source(where.root, where.path, credentials=credentials, kind=kind)
    if where.is_hub:
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", where.root):
            raise SourceError(f"{location}: expected hf://org/repo[@revision]")
        return HfSource(where.root, where.revision, credentials, kind)
    if not where.is_path:
        raise SourceError(f"{location}: unsupported scheme (use a local path, s3:// or hf://)")
    return LocalSource(Path(location), kind)


def delete_folder(s3: Any, bucket: str, key_prefix: str) -> None:
    """Every object under the folder, its provenance record last (a half-deleted folder stays recognisable): a
    retention delete (runtime/executor.py carries out the plan's `DeleteFolders`)."""
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key_prefix}/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    record = f"{key_prefix}/{PROVENANCE}"
    rest = [k for k in keys if k != record]
    for i in range(0, len(rest), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in rest[i : i + 1000]]})
    s3.delete_object(Bucket=bucket, Key=record)
