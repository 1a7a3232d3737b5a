"""The transfer modes and commands: `download` / `eval_download` (a spec
entry copied into a folder), and the `download` / `upload` commands over a
spec entry or a bare path or URI. Each runs the transfer engine once over a
store opened for it and closed after it, and logs one summary line.

No threads of its own (the Downloader and Uploader own theirs).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from datamount.errors import (
    DataError,
    ObjectNotFound,
    OutputError,
    SettingsError,
    StorageError,
    UriError,
)
from datamount.jobspec.job import DataInput, DataType, JobSpec
from datamount.log import activity
from datamount.modes.context import Context, Target, target
from datamount.storage import ObjectStore
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy
from datamount.transfer.downloader import (
    IN_FLIGHT_BUFFERS,
    RANGE_SIZE,
    Downloader,
    DownloadOptions,
    DownloadResult,
)
from datamount.transfer.progress import Progress
from datamount.transfer.source import SourceFile, folder_pages

if TYPE_CHECKING:  # imported where used: `download` starts faster without them
    from datamount.modes.handler import How
    from datamount.transfer.uploader import UploadResult

log = logging.getLogger("datamount.app")


class DownloadHandler:
    """download (the entry's files) and eval_download (the evaluated MLTable's)."""

    directions: tuple[str, ...] = ("input",)
    keeps_folder: bool = False

    def __init__(self, *, evaluated: bool) -> None:
        self.evaluated = evaluated

    def prepare(
        self, ctx: Context, spec: JobSpec, entry: DataInput, folder: Path, how: How
    ) -> Path:
        # Progress reporting runs for the download only, not for a mount's lifetime.
        progress = how.progress
        with progress if progress is not None else contextlib.nullcontext():
            if self.evaluated:
                return eval_download(ctx, spec, entry, folder, progress=progress).path
            location = ctx.resolve(spec, entry)
            tgt = Target(location, entry.type is DataType.URI_FILE, f"inputs.{entry.name}")
            return download_target(ctx, tgt, folder, progress=progress).path

    def finish(self, ctx: Context, folder: Path, *, timeout: float | None, register: bool) -> str:
        raise DataError(f"{folder} is not mounted")


@dataclass(frozen=True)
class Shard:
    """`download --shard auto`: this node's part of a folder's files. A file
    belongs to node sha256(relative path) % world_size: the same files on
    every rerun and whatever the listing order, and a file added later moves
    no other file to another node."""

    rank: int
    world_size: int

    @classmethod
    def from_context(cls, ctx: Context) -> Shard:
        """RANK / WORLD_SIZE as torchrun and Azure ML set them (0 / 1 when unset)."""
        raw = ctx.environ.get("WORLD_SIZE", "").strip() or "1"
        if not raw.isdigit() or int(raw) < 1:
            raise SettingsError(f"WORLD_SIZE: expected a positive integer, got {raw!r}")
        rank, world = ctx.rank(), int(raw)
        if rank >= world:
            raise SettingsError(f"RANK: {rank} is not below WORLD_SIZE {world}")
        return cls(rank, world)

    def holds(self, rel: str) -> bool:
        digest = hashlib.sha256(rel.encode("utf-8", "surrogateescape")).digest()
        return int.from_bytes(digest[:8], "big") % self.world_size == self.rank

    def pages(self, pages: Iterator[list[SourceFile]]) -> Iterator[list[SourceFile]]:
        for page in pages:
            yield [f for f in page if self.holds(f.rel)]


def download(
    ctx: Context,
    source: str,
    dest: Path,
    *,
    name: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    shard: Shard | None = None,
) -> DownloadResult:
    """The `download` command: a spec entry, or a bare path or URI; with
    `shard`, only this node's files of a folder (a single file: every node)."""
    return download_target(ctx, target(ctx, source, name, "input"), dest, overwrite=overwrite,
                           progress=progress, shard=shard)  # fmt: skip


def download_target(
    ctx: Context,
    tgt: Target,
    dest: Path,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
    shard: Shard | None = None,
) -> DownloadResult:
    retry = ctx.retry()
    with activity("download", source=tgt.label):
        store = ctx.store(tgt.location, retry)

        def is_file() -> bool:
            return tgt.is_file if tgt.is_file is not None else _is_file(store, tgt.location)

        uri = tgt.location.uri()
        source_id = uri if shard is None else f"{uri}#shard={shard.rank}/{shard.world_size}"
        return _download(ctx, store, tgt.location.key, is_file, dest, retry, uri=uri,
                         source_id=source_id, overwrite=overwrite, progress=progress,
                         shard=shard)  # fmt: skip


def _is_file(store: ObjectStore, location: StorageLocation) -> bool:
    """A bare URI names a file when an object (not a folder marker) sits at its key."""
    if location.is_folder or not location.key:
        return False
    try:
        return not store.stat(location.key).is_dir
    except ObjectNotFound:
        return False


def eval_download(
    ctx: Context,
    spec: JobSpec,
    entry: DataInput,
    dest: Path,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> DownloadResult:
    """eval_download: the files of the evaluated MLTable (and the layout's
    MLTable file) copied to `dest/<account>/<container>/<path>`."""
    location = ctx.resolve(spec, entry)
    retry = ctx.retry()
    with activity("eval_download", source=f"inputs.{entry.name}"):
        from datamount.mltable import evalmode  # MLTable support (numpy, pyarrow): only when used

        store = evalmode.evaluated_store(
            location, ctx.workspace(), lambda loc: ctx.store(loc, retry)
        )
        uri = location.uri()  # the whole store is the evaluated MLTable's layout
        return _download(ctx, store, "", lambda: False, dest, retry, uri=uri,
                         source_id=f"eval:{uri}", overwrite=overwrite,
                         progress=progress)  # fmt: skip


def _download(
    ctx: Context,
    store: ObjectStore,
    key: str,
    is_file: Callable[[], bool],
    dest: Path,
    retry: RetryPolicy,
    *,
    uri: str,
    source_id: str,
    overwrite: bool,
    progress: Progress | None,
    shard: Shard | None = None,
) -> DownloadResult:
    """Run the Downloader over `key` of `store` (closed at the end); `uri`
    names the source in errors and logs, `source_id` in the resume manifest;
    a folder's listing filtered to `shard` before it reaches the Downloader."""
    settings = ctx.settings
    try:
        threads = ctx.in_flight(
            store, key, "RSLEX_DOWNLOADER_THREADS", settings.downloader_threads,
            cap=IN_FLIGHT_BUFFERS // RANGE_SIZE,
        )  # fmt: skip
        options = DownloadOptions(
            threads=threads,
            reserved_free_disk_space=settings.reserved_free_disk_space,
            overwrite=overwrite,
            fsync=settings.download_fsync,
            processes=settings.download_processes,
            manifest_dir=settings.cache_dir / "manifests",
        )
        downloader = Downloader(store, options, progress)
        if shard is not None and not is_file():
            pages = shard.pages(folder_pages(store, key))
            result = downloader.copy(pages, dest, source_id=source_id)
            log.info("download --shard auto: node %d of %d", shard.rank, shard.world_size)
        else:
            result = downloader.download(key, dest, is_file=is_file(), source_id=source_id)
    except StorageError as exc:
        again = exc.transient or exc.exhausted
        raise DataError(f"download of {uri} failed: {exc}", transient=again) from None
    finally:
        store.close()
    log.info(
        "downloaded %s -> %s: %d files, %d bytes in %.2f s (%.1f MB/s), %d skipped "
        "(%d bytes, already complete), %d threads, %d retries, %d restarts",
        source_id, result.path, result.files, result.bytes, result.seconds,
        result.bytes / max(result.seconds, 1e-9) / 1e6, result.skipped_files,
        result.skipped_bytes, options.threads, retry.stats.retries, result.restarts,
    )  # fmt: skip
    return result


def upload(
    ctx: Context,
    src: Path,
    dest: str,
    *,
    name: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> UploadResult:
    """The `upload` command: to a spec entry, or to a bare URI."""
    tgt = target(ctx, dest, name, "output")
    if tgt.location.kind is StorageKind.HTTP:
        raise UriError(f"{dest}: cannot upload to a public http(s) URL")
    return upload_target(ctx, src, tgt, overwrite=overwrite, progress=progress)


def upload_target(
    ctx: Context,
    src: Path,
    tgt: Target,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> UploadResult:
    settings = ctx.settings
    uri = tgt.location.uri()
    retry = ctx.retry()
    with activity("upload", destination=tgt.label):
        store = ctx.store(tgt.location, retry)
        key = tgt.location.key
        if tgt.is_file is False and key:
            key = key.rstrip("/") + "/"
        try:
            from datamount.transfer.uploader import Uploader, UploadOptions

            options = UploadOptions(threads=settings.downloader_threads, overwrite=overwrite)
            result = Uploader(store, options, progress).upload(src, key)
        except StorageError as exc:
            raise OutputError(f"upload to {uri} failed: {exc}") from None
        finally:
            store.close()
        log.info(
            "uploaded %s -> %s: %d files, %d bytes in %.2f s (%.1f MB/s), %d unchanged skipped "
            "(%d bytes), %d threads, %d retries",
            src, uri, result.files, result.bytes, result.seconds,
            result.bytes / max(result.seconds, 1e-9) / 1e6, result.skipped_files,
            result.skipped_bytes, options.threads, retry.stats.retries,
        )  # fmt: skip
        return result
