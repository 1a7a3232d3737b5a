"""AzureBlobStore: the ObjectStore over one Azure Blob container (also ADLS
Gen2 filesystems, read and written through their blob endpoint).

Two request paths, both behind one RetryPolicy (`_call`: every request goes
through `RetryPolicy.call` and `storage.errormap.translate`; the SDK's and
urllib3's own retries are off):

- raw Blob REST requests (storage.azure_raw, signed by storage.azure_auth,
  answers read by storage.azure_list) for everything a download or a mount
  does: `list_pages`, `stat`, the reads, `stage_block` and `put`: one bounded
  ranged GET per read, the body read straight into the caller's buffer;
- the SDK's ContainerClient for `commit_blocks`, `copy` and `delete`, where
  its cost does not matter, imported on the first of those calls.
  Why not the SDK for the rest: docs/design/storage.md ("Why the raw path").

Listings always ask for metadata, so folder markers (`hdi_isfolder`) are
directories in every listing as in `stat`. Identity credentials use the raw
path too (a bearer token, https only). Both paths stop a request that
receives no byte for `read_timeout` seconds. The clients are shared per
(endpoint, container, credential) (storage.azure_clients, reference counted),
with pools of `pool_size` keep-alive connections.

Threads: the clients are thread-safe; a store holds no per-request state.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamount.errors import StorageError
from datamount.storage.azure_clients import (
    DEFAULT_READ_TIMEOUT,
    SdkClients,
    account_of,
    acquire,
    release,
)
from datamount.storage.azure_list import (
    FIRST_DIR_PAGE_SIZE,
    PAGE_SIZE,
    b64_md5,
    http_time,
    info_from_headers,
    list_params,
    parse_list,
    quoted_etag,
)
from datamount.storage.base import ListPage, ObjectInfo, ObjectStore, check_range
from datamount.storage.credentials import Credential, CredentialKind
from datamount.storage.errormap import translate
from datamount.storage.location import StorageLocation
from datamount.storage.retry import DEFAULT_MIN_SECONDS, RetryPolicy, RetryStats

__all__ = ["AzureBlobStore", "account_of"]

COPY_POLL_MAX = 1.0
COPY_TIMEOUT = 3600.0


class _SinkFailed(Exception):
    """read_span's sink raised: ends the request, never retried."""


class AzureBlobStore(ObjectStore):
    def __init__(
        self,
        endpoint: str,
        container: str,
        credential: Credential | None = None,
        *,
        account: str = "",
        pool_size: int = 16,
        retry: RetryPolicy | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        ca_bundle: Path | None = None,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.container = container
        self.credential = credential or Credential.anonymous()
        self.root = f"{self.endpoint}/{container}"
        self.retry = retry or RetryPolicy(min_seconds=DEFAULT_MIN_SECONDS)
        self.read_timeout = read_timeout
        self._shared = acquire(
            self.endpoint, container, self.credential, account, pool_size, ca_bundle
        )
        self.raw = self._shared.raw  # tests add hooks to count its requests
        # Per-call transport option of the SDK path: the same stall timeout.
        self._sdk_kw: dict[str, Any] = {"read_timeout": read_timeout}
        self._closed = False
        self._recipe = AzureRecipe(
            self.endpoint, container, self.credential, account, pool_size, read_timeout, ca_bundle,
            (self.retry.retries, self.retry.base_delay, self.retry.max_delay,
             self.retry.min_seconds),
        )  # fmt: skip

    def recipe(self) -> AzureRecipe | None:
        """How another process opens the same store (the lanes' worker
        processes); None for identity credentials, whose tokens this
        process's azure-identity object renews."""
        kind = self.credential.kind
        if kind in (CredentialKind.USER_IDENTITY, CredentialKind.MANAGED_IDENTITY):
            return None
        return self._recipe

    def retry_stats(self) -> RetryStats:
        return self.retry.stats

    @classmethod
    def from_location(
        cls,
        location: StorageLocation,
        *,
        pool_size: int = 16,
        retry: RetryPolicy | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        ca_bundle: Path | None = None,
    ) -> AzureBlobStore:
        return cls(
            location.endpoint,
            location.container,
            location.credential,
            account=location.account,
            pool_size=pool_size,
            retry=retry,
            read_timeout=read_timeout,
            ca_bundle=ca_bundle,
        )

    def __repr__(self) -> str:
        return f"AzureBlobStore({self.root!r}, {self.credential.describe()})"

    def _sdk(self) -> SdkClients:
        return self._shared.sdk()

    @property
    def session(self) -> Any:
        """The SDK's requests Session (created on first use; tests hook it)."""
        return self._sdk().session

    def _call(self, op: str, key: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        def attempt() -> Any:
            with translate(op, key, store=self.root):
                return fn(*args, **kwargs)

        return self.retry.call(attempt, description=f"{op} {key!r}")

    # -- reads -------------------------------------------------------------

    def list_pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ListPage]:
        target = f"{self.root}/{prefix}"

        def fetch(marker: str | None) -> tuple[ListPage, str | None]:
            size = FIRST_DIR_PAGE_SIZE if delimiter and marker is None else PAGE_SIZE
            body = self.raw.get_container(
                list_params(prefix, delimiter, marker, size),
                op="list",
                key=prefix,
                timeout=self.read_timeout,
            )
            return parse_list(body, target=target)

        marker: str | None = None
        while True:
            # A failed page is asked for again with the same marker.
            page, marker = self._call("list", prefix, fetch, marker)
            yield page
            if not marker:
                return

    def stat(self, key: str) -> ObjectInfo:
        headers = self._call("stat", key, self.raw.head, key, timeout=self.read_timeout)
        return info_from_headers(key, headers)

    def read(self, key: str, offset: int, length: int, *, etag: str | None = None) -> bytes:
        check_range(offset, length)
        if length == 0:
            return b""
        data: bytes = self._call(
            "read",
            key,
            self.raw.get_bytes,
            key,
            offset,
            length,
            etag=etag,
            timeout=self.read_timeout,
        )
        return data

    def read_into(
        self, key: str, offset: int, buffer: memoryview, *, etag: str | None = None
    ) -> int:
        if not isinstance(buffer, memoryview):  # a slice of a bytearray is a copy
            buffer = memoryview(buffer)
        return self.read_into_views(key, offset, [buffer], etag=etag)

    def read_into_views(
        self, key: str, offset: int, buffers: Sequence[memoryview], *, etag: str | None = None
    ) -> int:
        total = sum(map(len, buffers))
        check_range(offset, total)
        if not total:
            return 0
        n: int = self._call(
            "read",
            key,
            self.raw.get_into_views,
            key,
            offset,
            buffers,
            etag=etag,
            timeout=self.read_timeout,
        )
        return n

    def read_span(
        self,
        key: str,
        offset: int,
        length: int,
        buffer: memoryview,
        sink: Callable[[memoryview, int], None],
        *,
        etag: str | None = None,
    ) -> int:
        """One GET for the whole span, read through `buffer` (RawClient.get_pieces);
        a retry asks again for what has not reached `sink` yet."""
        if not isinstance(buffer, memoryview):
            buffer = memoryview(buffer)
        check_range(offset, length)
        if not length or not len(buffer):
            return 0
        done = 0  # bytes [offset, offset + done) went to the sink
        failed: list[BaseException] = []

        def piece(view: memoryview, pos: int) -> None:
            nonlocal done
            try:
                sink(view, pos)
            except BaseException as exc:  # the caller's (a local disk): not a storage error
                failed.append(exc)
                raise _SinkFailed from None
            done = pos + len(view) - offset

        def rest() -> int:
            start = offset + done
            return done + self.raw.get_pieces(
                key, start, length - done, buffer, piece, etag=etag, timeout=self.read_timeout
            )

        try:
            n: int = self._call("read", key, rest)
        except _SinkFailed:
            raise failed[0] from None
        return n

    # -- writes ------------------------------------------------------------

    def stage_block(self, key: str, block_id: str, data: bytes) -> None:
        # The id is base64-encoded exactly as the SDK's commit_block_list
        # encodes it; Azure wants equal-length ids per blob.
        encoded = base64.b64encode(block_id.encode()).decode()
        params = [("comp", "block"), ("blockid", encoded)]
        self._call(
            "stage_block",
            key,
            self.raw.put,
            "stage_block",
            key,
            params,
            {},
            data,
            timeout=self.read_timeout,
        )

    def commit_blocks(
        self,
        key: str,
        block_ids: list[str],
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        from azure.storage.blob import ContentSettings

        blob = self._sdk().client.get_blob_client(key)
        settings = ContentSettings(content_md5=bytearray(content_md5)) if content_md5 else None
        self._call(
            "commit_blocks",
            key,
            blob.commit_block_list,
            list(block_ids),
            content_settings=settings,
            metadata=metadata,
            **self._sdk_kw,
        )
        # Put Block List does not return the size: one HEAD per committed file.
        return self.stat(key)

    def put(
        self,
        key: str,
        data: bytes,
        *,
        content_md5: bytes | None = None,
        metadata: dict[str, str] | None = None,
    ) -> ObjectInfo:
        headers = {"x-ms-blob-type": "BlockBlob", "Content-Type": "application/octet-stream"}
        if content_md5:
            headers["x-ms-blob-content-md5"] = base64.b64encode(content_md5).decode()
        for name, value in (metadata or {}).items():
            headers[f"x-ms-meta-{name}"] = value
        answer: dict[str, str] = self._call(
            "put", key, self.raw.put, "put", key, [], headers, data, timeout=self.read_timeout
        )
        return ObjectInfo(
            key=key,
            size=len(data),
            etag=quoted_etag(answer.get("etag")),
            last_modified=http_time(answer.get("last-modified")),
            content_md5=content_md5 or b64_md5(answer.get("content-md5")),
        )

    def delete(self, key: str) -> None:
        blob = self._sdk().client.get_blob_client(key)
        self._call("delete", key, blob.delete_blob, **self._sdk_kw)

    def copy(self, src_key: str, dst_key: str) -> ObjectInfo:
        client = self._sdk().client
        source = client.get_blob_client(src_key).url
        if self.credential.kind is CredentialKind.SAS and self.credential.secret:
            # The service reads the source itself: it needs the token in the URL.
            source += "?" + self.credential.secret.reveal()
        dst = client.get_blob_client(dst_key)
        self._call("copy", src_key, dst.start_copy_from_url, source, **self._sdk_kw)
        # Same-account copies finish at once; large ones may stay pending a while.
        delay, deadline = 0.02, time.monotonic() + COPY_TIMEOUT
        while True:
            headers = self._call("copy", dst_key, self.raw.head, dst_key, timeout=self.read_timeout)
            status = headers.get("x-ms-copy-status")
            if status in (None, "success"):
                return info_from_headers(dst_key, headers)
            if status != "pending" or time.monotonic() > deadline:
                raise StorageError(f"copy {src_key!r} to {dst_key!r} failed: copy {status}")
            time.sleep(delay)
            delay = min(delay * 2, COPY_POLL_MAX)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            release(self.endpoint, self.container, self.credential)


@dataclass(frozen=True)
class AzureRecipe:
    """The picklable arguments of an AzureBlobStore, secret included (it
    travels over a worker's pipe only: never argv, environment or logs;
    `credential` prints as its kind)."""

    endpoint: str
    container: str
    credential: Credential
    account: str
    pool_size: int
    read_timeout: float
    ca_bundle: Path | None
    retry: tuple[int, float, float, float]  # RetryPolicy's retries, base_delay, max_delay,
    # min_seconds

    def open(self, pool_size: int | None = None) -> AzureBlobStore:
        retries, base, most, least = self.retry
        return AzureBlobStore(
            self.endpoint, self.container, self.credential, account=self.account,
            pool_size=pool_size or self.pool_size, read_timeout=self.read_timeout,
            ca_bundle=self.ca_bundle,
            retry=RetryPolicy(retries, base, most, min_seconds=least),
        )  # fmt: skip
