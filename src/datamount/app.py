"""Composition root: builds the per-run objects (settings, workspace, stores)
from what the CLI parsed, and holds the operations the commands run.

The only module that wires layers together; nothing imports it but `cli`.
No threads of its own yet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamount import evalmode, mountd, outputs, registry
from datamount.errors import (
    DataError,
    DatamountError,
    InvalidInput,
    ObjectNotFound,
    OutputError,
    SpecError,
    StorageError,
    UriError,
)
from datamount.fs.namespace import Namespace
from datamount.fs.ops import ReadOnlyFS
from datamount.fs.writable import WritableFS
from datamount.location import StorageKind, StorageLocation
from datamount.log import RUNTIME_LOG, activity
from datamount.reader import Reader
from datamount.readstack import build_reader
from datamount.retry import RetryPolicy
from datamount.settings import Settings
from datamount.spec import DataInput, DataType, JobSpec, Mode, load_spec
from datamount.stats import MountStats
from datamount.storage import ObjectStore, open_store
from datamount.storage.base import ListPage
from datamount.transfer.download import Downloader, DownloadOptions, DownloadResult
from datamount.transfer.progress import Progress
from datamount.transfer.upload import Uploader, UploadOptions, UploadResult
from datamount.uris import LocationKind, parse
from datamount.workspace import Workspace, find_workspace
from datamount.writeback import WriteBack, WriteBackOptions

log = logging.getLogger("datamount.app")


@dataclass(frozen=True)
class Context:
    """What every command gets: settings read once, and where to find the workspace."""

    settings: Settings
    environ: Mapping[str, str]
    cwd: Path
    workspace_flag: str | None = None

    def workspace_path(self) -> Path:
        flag = self.workspace_flag or (
            str(self.settings.workspace) if self.settings.workspace else None
        )
        return find_workspace(flag, self.environ, self.cwd)

    def workspace_is_explicit(self) -> bool:
        return bool(self.workspace_flag or self.settings.workspace)

    def load_workspace(self, *, required: bool = True) -> Workspace | None:
        """The workspace; with required=False a missing default file yields None."""
        path = self.workspace_path()
        if not required and not self.workspace_is_explicit() and not path.exists():
            return None
        workspace = Workspace.load(path, self.environ)
        log.info(
            "workspace %s: %d datastores, %d data assets",
            path,
            len(workspace.config.datastores),
            len(workspace.config.data_assets),
        )
        return workspace


def resolve_entry(spec: JobSpec, entry: DataInput, workspace: Workspace) -> StorageLocation:
    """Where `entry`'s bytes live, with the credential to reach them."""
    identity = entry.identity or spec.identity
    base_dir = spec.source.parent if spec.source else None
    return workspace.resolve(
        entry.location,
        where=f"{entry.direction}s.{entry.name}.path",
        identity=identity.type.value if identity else None,
        client_id=identity.client_id if identity else None,
        base_dir=base_dir,
        expected_type=entry.type.value,
    )


def all_entries(spec: JobSpec) -> list[DataInput]:
    return [*spec.data_inputs.values(), *spec.outputs.values()]


@dataclass(frozen=True)
class Validation:
    spec: JobSpec
    workspace_checked: Path | None


def validate(ctx: Context, spec_path: Path) -> Validation:
    """Check the spec, and its datastores/assets when a workspace is at hand.

    Pure: no network. Every problem of every entry is reported at once.
    """
    with activity("validate"):
        spec = load_spec(spec_path)
        workspace = ctx.load_workspace(required=False)
        if workspace is None:
            return Validation(spec, None)
        problems: list[str] = []
        for entry in all_entries(spec):
            try:
                resolve_entry(spec, entry, workspace)
            except InvalidInput as exc:
                problems += exc.problems
        if problems:
            raise SpecError(problems)
        return Validation(spec, workspace.source)


def resolve(ctx: Context, target: str, input_name: str | None) -> list[tuple[str, str]]:
    """`direct` mode: the resolved URI of one spec entry, or of a bare URI.

    Returns (name, uri) pairs; one pair unless the spec has several entries
    and `input_name` is None and the caller asked for all.
    """
    with activity("resolve"):
        path = Path(target)
        if not path.is_file() and _looks_like_uri(target):
            if input_name:
                raise UriError(f"--input {input_name}: only applies to a spec file, not a URI")
            workspace = ctx.load_workspace()
            assert workspace is not None
            location = workspace.resolve(parse(target, "URI"), where="URI", base_dir=ctx.cwd)
            _log_resolved("URI", target, location)
            return [("uri", location.uri())]
        spec = load_spec(path)
        workspace = ctx.load_workspace()
        assert workspace is not None
        entry = spec.entry(input_name)
        location = resolve_entry(spec, entry, workspace)
        _log_resolved(f"{entry.direction}s.{entry.name}", entry.path, location)
        return [(entry.name, location.uri())]


def _log_resolved(what: str, raw: str, location: StorageLocation) -> None:
    log.info(
        "resolved %s (%s) -> %s (%s, credential %s)",
        what,
        raw,
        location.uri(),
        location.kind.value,
        location.credential.describe(),
    )


def _looks_like_uri(text: str) -> bool:
    if "://" in text or text.startswith("azureml:"):
        return True
    try:
        return parse(text).kind is not LocationKind.LOCAL
    except InvalidInput:
        return False


# -- transfers ---------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A resolved data location plus what the spec says about it."""

    location: StorageLocation
    is_file: bool | None  # None: decide from the store (bare URIs)
    label: str


def make_retry(settings: Settings) -> RetryPolicy:
    return RetryPolicy(retries=settings.http_retry_count)


def make_store(settings: Settings, location: StorageLocation, retry: RetryPolicy) -> ObjectStore:
    # One keep-alive connection per worker that may hold one at a time.
    pool = max(settings.downloader_threads, settings.read_threads)
    return open_store(
        location, pool_size=pool, retry=retry, read_timeout=settings.stall_timeout_seconds
    )


def target(ctx: Context, source: str, name: str | None, direction: str) -> Target:
    """A spec file (+ --input/--output NAME) or a bare path/URI, resolved."""
    path = Path(source)
    workspace = ctx.load_workspace(required=False) or Workspace.empty()
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        spec = load_spec(path)
        entry = spec.entry(name)
        location = resolve_entry(spec, entry, workspace)
        return Target(location, entry.type is DataType.URI_FILE, f"{entry.direction}s.{entry.name}")
    if name:
        raise UriError(f"--{direction} {name}: only applies to a spec file, not a path or URI")
    location = workspace.resolve(parse(source, direction), where=direction, base_dir=ctx.cwd)
    is_file = True if location.kind is StorageKind.HTTP else None
    return Target(location, is_file, source)


def _is_file(store: ObjectStore, location: StorageLocation) -> bool:
    """A bare URI names a file when an object (not a folder marker) sits at its key."""
    if location.is_folder or not location.key:
        return False
    try:
        return not store.stat(location.key).is_dir
    except ObjectNotFound:
        return False


def download(
    ctx: Context,
    source: str,
    dest: Path,
    *,
    name: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> DownloadResult:
    settings = ctx.settings
    tgt = target(ctx, source, name, "input")
    uri = tgt.location.uri()
    retry = make_retry(settings)
    with activity("download", source=tgt.label):
        store = make_store(settings, tgt.location, retry)
        try:
            is_file = tgt.is_file if tgt.is_file is not None else _is_file(store, tgt.location)
            options = DownloadOptions(
                threads=settings.downloader_threads,
                reserved_free_disk_space=settings.reserved_free_disk_space,
                overwrite=overwrite,
                fsync=settings.download_fsync,
            )
            downloader = Downloader(store, options, progress)
            result = downloader.download(tgt.location.key, dest, is_file=is_file, source_id=uri)
        except StorageError as exc:
            again = exc.transient or exc.exhausted
            raise DataError(f"download of {uri} failed: {exc}", transient=again) from None
        finally:
            store.close()
        log.info(
            "downloaded %s -> %s: %d files, %d bytes in %.2f s (%.1f MB/s), %d skipped "
            "(%d bytes, already complete), %d threads, %d retries, %d restarts",
            uri, result.path, result.files, result.bytes, result.seconds,
            result.bytes / max(result.seconds, 1e-9) / 1e6, result.skipped_files,
            result.skipped_bytes, options.threads, retry.stats.retries, result.restarts,
        )  # fmt: skip
        return result


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
    settings = ctx.settings
    workspace = ctx.load_workspace(required=False) or Workspace.empty()
    location = resolve_entry(spec, entry, workspace)
    retry = make_retry(settings)
    uri = location.uri()
    with activity("eval_download", source=f"inputs.{entry.name}"):
        store = evalmode.evaluated_store(
            location, workspace, lambda loc: make_store(settings, loc, retry)
        )
        try:
            options = DownloadOptions(
                threads=settings.downloader_threads,
                reserved_free_disk_space=settings.reserved_free_disk_space,
                overwrite=overwrite,
                fsync=settings.download_fsync,
            )
            downloader = Downloader(store, options, progress)
            result = downloader.download("", dest, is_file=False, source_id=f"eval:{uri}")
        except StorageError as exc:
            again = exc.transient or exc.exhausted
            raise DataError(f"eval_download of {uri} failed: {exc}", transient=again) from None
        finally:
            store.close()
        log.info(
            "eval_download %s -> %s: %d files, %d bytes in %.2f s, %d skipped, %d retries",
            uri, dest, result.files, result.bytes, result.seconds, result.skipped_files,
            retry.stats.retries,
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
    settings = ctx.settings
    tgt = target(ctx, dest, name, "output")
    uri = tgt.location.uri()
    if tgt.location.kind is StorageKind.HTTP:
        raise UriError(f"{dest}: cannot upload to a public http(s) URL")
    retry = make_retry(settings)
    with activity("upload", destination=tgt.label):
        store = make_store(settings, tgt.location, retry)
        key = tgt.location.key
        if tgt.is_file is False and key:
            key = key.rstrip("/") + "/"
        try:
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


def mount(
    ctx: Context,
    spec_path: Path,
    mountpoint: Path,
    *,
    name: str | None,
    progress: Progress | None,
    foreground: bool = False,
    daemon_argv: list[str] | None = None,
    ready_fd: int | None = None,
    on_ready: Callable[[Path], None] | None = None,
) -> Path | str:
    """The sidecar entry point; returns the path the job should use (the
    resolved URI for `direct`).

    ro_mount: without `foreground`, starts the daemon (`daemon_argv`) and
    returns once the mount answers; with it, serves the mount in this process
    (calling `on_ready` with the path once it answers) until it is unmounted.
    `ready_fd` is set in the spawned daemon: its handshake pipe to `mount`.
    `progress` is entered here, around a download only.
    """
    readiness = mountd.Readiness(ready_fd)
    try:
        spec = load_spec(spec_path)
        entry = spec.entry(name)
        if entry.mode is Mode.DOWNLOAD:
            # Progress reporting runs for the download only, not for a mount's lifetime.
            with progress if progress is not None else contextlib.nullcontext():
                result = download(
                    ctx, str(spec_path), mountpoint, name=entry.name, progress=progress
                )
            return result.path
        if entry.mode is Mode.EVAL_DOWNLOAD:
            with progress if progress is not None else contextlib.nullcontext():
                return eval_download(ctx, spec, entry, mountpoint, progress=progress).path
        if entry.mode is Mode.UPLOAD:
            return prepare_upload_output(ctx, spec, entry, mountpoint)
        if entry.mode is Mode.DIRECT:
            workspace = ctx.load_workspace(required=False) or Workspace.empty()
            return resolve_entry(spec, entry, workspace).uri()
        if entry.mode is Mode.RW_MOUNT:
            return _rw_mount(
                ctx, spec, entry, mountpoint, foreground=foreground, daemon_argv=daemon_argv,
                readiness=readiness, on_ready=on_ready,
            )  # fmt: skip
        if entry.mode not in (Mode.RO_MOUNT, Mode.EVAL_MOUNT):
            raise DatamountError(
                f"{entry.direction}s.{entry.name}: mode {entry.mode.value} is not available"
            )
        if entry.direction != "input":
            raise SpecError(f"outputs.{entry.name}: {entry.mode.value} is an input mode")
        return _ro_mount(
            ctx, spec, entry, mountpoint, foreground=foreground, daemon_argv=daemon_argv,
            readiness=readiness, on_ready=on_ready,
        )  # fmt: skip
    except DatamountError as exc:
        readiness.fail(exc)
        raise


def _ro_mount(
    ctx: Context,
    spec: JobSpec,
    entry: DataInput,
    mountpoint: Path,
    *,
    foreground: bool,
    daemon_argv: list[str] | None,
    readiness: mountd.Readiness,
    on_ready: Callable[[Path], None] | None,
) -> Path:
    """ro_mount, and eval_mount: the same read-only stack over the evaluated
    MLTable's files (evalmode.evaluated_store), evaluated by the process that
    serves the mount (a failure comes back through the start-up handshake)."""
    settings = ctx.settings
    mountpoint = Path(mountd.mount_key(mountpoint))
    workspace = ctx.load_workspace(required=False) or Workspace.empty()
    location = resolve_entry(spec, entry, workspace)
    is_file = entry.type is DataType.URI_FILE
    evaluated = entry.mode is Mode.EVAL_MOUNT
    label = f"inputs.{entry.name}"
    # The user-facing process records the activity; the daemon it spawns does not.
    recording = readiness.fd is None
    with contextlib.ExitStack() as cleanup:
        recorder = activity("mount", input=label, mountpoint=mountpoint, mode=entry.mode.value)
        with recorder if recording else contextlib.nullcontext():
            mountd.prepare_mountpoint(mountpoint, settings.cache_dir)
            retry = make_retry(settings)
            store: ObjectStore | None = None
            if not evaluated:
                store = make_store(settings, location, retry)
                cleanup.callback(store.close)
                _check_source(store, location, is_file)
            path = (
                mountpoint / location.key.rstrip("/").rpartition("/")[2] if is_file else mountpoint
            )
            if not foreground:
                if daemon_argv is None:
                    raise DatamountError("mount: no daemon command to start")
                pid = mountd.spawn(
                    daemon_argv, mountpoint=mountpoint, log_file=settings.log_dir / RUNTIME_LOG,
                    env=ctx.environ,
                )  # fmt: skip
                log.info("mounted %s at %s (daemon pid %d)", location.uri(), mountpoint, pid)
                return path
            root: str | None = None
            if store is None:
                store = evalmode.evaluated_store(
                    location, workspace, lambda loc: make_store(settings, loc, retry)
                )
                cleanup.callback(store.close)
                root = ""  # the eval layout: <account>/<container>/<path>, MLTable
            stats = MountStats()
            reader = make_reader(settings, store, stats, location)
            cleanup.callback(reader.close)
            fs = make_fs(settings, store, reader, location, is_file=is_file, root_key=root)
            cleanup.callback(fs.close)
            daemon = _daemon(ctx, spec, entry, location, fs, stats, mountpoint, retry)
            daemon.start()
        readiness.ok()
        if on_ready is not None:
            on_ready(path)
        daemon.run()
        return path


# Attributes of an rw_mount expire after 2 s when DATASET_MOUNT_ATTRIBUTE_CACHE_TTL
# is unset: other writers' changes show up soon; a mount's own writes
# invalidate its caches at once.
RW_ATTRIBUTE_TTL_MS = 2000


def _rw_mount(
    ctx: Context,
    spec: JobSpec,
    entry: DataInput,
    mountpoint: Path,
    *,
    foreground: bool,
    daemon_argv: list[str] | None,
    readiness: mountd.Readiness,
    on_ready: Callable[[Path], None] | None,
) -> Path:
    """rw_mount: the ro_mount stack plus write-back staging (fs.writable,
    writeback). Staged files live in <cache>/staging/<hash of the output URI>/,
    so a new mount of the same output with the same cache re-uploads what a
    previous one could not."""
    label = f"{entry.direction}s.{entry.name}"
    is_file = entry.type is DataType.URI_FILE
    if ctx.settings.attribute_cache_ttl_ms is None:
        rw = ctx.settings.model_copy(update={"attribute_cache_ttl_ms": RW_ATTRIBUTE_TTL_MS})
        ctx = dataclasses.replace(ctx, settings=rw)
    settings = ctx.settings
    mountpoint = Path(mountd.mount_key(mountpoint))
    workspace = ctx.load_workspace(required=False) or Workspace.empty()
    location = resolve_entry(spec, entry, workspace)
    if location.kind is StorageKind.HTTP:
        raise UriError(f"{label}: cannot write to a public http(s) URL")
    if is_file and (location.is_folder or not location.key.strip("/")):
        raise SpecError(f"{label}: a uri_file path must name a file, not a folder")
    # A uri_file shows as MOUNTPOINT/<its name>, the only name in the mount.
    path = mountpoint / location.key.rpartition("/")[2] if is_file else mountpoint
    recording = readiness.fd is None
    with contextlib.ExitStack() as cleanup:
        recorder = activity("mount", output=label, mountpoint=mountpoint)
        with recorder if recording else contextlib.nullcontext():
            mountd.prepare_mountpoint(mountpoint, settings.cache_dir)
            retry = make_retry(settings)
            store = make_store(settings, location, retry)
            cleanup.callback(store.close)
            try:  # credentials and container checked before anything is mounted
                prefix = location.key.rpartition("/")[0] if is_file else location.key
                next(iter(store.list_pages(prefix, delimiter="/")), None)
            except StorageError as exc:
                raise OutputError(f"cannot reach {location.uri()}: {exc}") from None
            if not foreground:
                if daemon_argv is None:
                    raise DatamountError("mount: no daemon command to start")
                pid = mountd.spawn(
                    daemon_argv, mountpoint=mountpoint, log_file=settings.log_dir / RUNTIME_LOG
                )
                log.info("rw-mounted %s at %s (daemon pid %d)", location.uri(), mountpoint, pid)
                return path
            stats = MountStats()
            reader = make_reader(settings, store, stats, location)
            cleanup.callback(reader.close)
            staging = settings.cache_dir / "staging" / hashlib.sha256(
                location.uri().encode()
            ).hexdigest()[:24]  # fmt: skip
            writeback = WriteBack(
                store,
                staging,
                WriteBackOptions(
                    threads=settings.downloader_threads,
                    reserved_free_disk_space=settings.reserved_free_disk_space,
                ),
            )
            namespace = Namespace(
                store,
                "" if is_file else location.key,
                file_key=location.key if is_file else None,
                ttl=attribute_ttl(settings),
            )
            fs = WritableFS(namespace, reader, writeback, store_id=location.store_root)
            cleanup.callback(fs.close)
            log.info(
                "rw_mount %s at %s: staging in %s, attribute TTL %s s, upload blocks of %d B, "
                "%d upload threads",
                location.uri(), mountpoint, staging, attribute_ttl(settings),
                writeback.options.block_size, writeback.options.threads,
            )  # fmt: skip
            recovered = fs.start_recovery()
            if recovered:
                log.info("re-uploading %d files a previous mount left staged", recovered)
            daemon = _daemon(ctx, spec, entry, location, fs, stats, mountpoint, retry)
            daemon.start()
        readiness.ok()
        if on_ready is not None:
            on_ready(path)
        daemon.run()
        if daemon.unsaved:
            raise OutputError(
                f"{label}: {len(daemon.unsaved)} files could not be uploaded (kept in {staging}): "
                + ", ".join(daemon.unsaved)
            )
        return path


def _check_source(store: ObjectStore, location: StorageLocation, is_file: bool) -> None:
    """The data exists (before anything is mounted): DataError otherwise."""
    uri = location.uri()
    try:
        if is_file:
            if location.is_folder:
                raise DataError(f"{uri}: a uri_file path must name a file, not a folder")
            if store.stat(location.key).is_dir:
                raise DataError(f"{uri}: is a folder, not a file (use type uri_folder)")
            return
        if location.kind is StorageKind.HTTP:
            raise DataError(f"{uri}: an http(s) URL is one file: mount it as a uri_file")
        prefix = location.key.rstrip("/")
        pages = store.list_pages(prefix + "/" if prefix else "", delimiter="/")
        first = next(iter(pages), ListPage())
        if prefix and not (first.objects or first.prefixes):
            raise DataError(f"{uri}: no such folder (nothing is stored under it)")
    except ObjectNotFound as exc:
        raise DataError(f"{uri}: not found ({exc})") from None
    except StorageError as exc:
        again = exc.transient or exc.exhausted
        raise DataError(f"cannot read {uri}: {exc}", transient=again) from None


def make_reader(
    settings: Settings, store: ObjectStore, stats: MountStats, location: StorageLocation
) -> Reader:
    """The read path under a mount: the one place a Reader is chosen (readstack)."""
    return build_reader(settings, store, stats, cache_key=location.uri())


def make_fs(
    settings: Settings,
    store: ObjectStore,
    reader: Reader,
    location: StorageLocation,
    *,
    is_file: bool,
    root_key: str | None = None,
) -> ReadOnlyFS:
    """Namespace (listings, attribute cache) + reader -> the filesystem ops.
    `root_key` overrides where in the store the tree starts (eval_mount)."""
    namespace = Namespace(
        store,
        root_key if root_key is not None else "" if is_file else location.key,
        file_key=location.key if is_file else None,
        ttl=attribute_ttl(settings),
    )
    return ReadOnlyFS(namespace, reader, store_id=location.store_root)


def attribute_ttl(settings: Settings) -> float | None:
    """DATASET_MOUNT_ATTRIBUTE_CACHE_TTL in seconds; None = never expires."""
    ms = settings.attribute_cache_ttl_ms
    return None if ms is None else ms / 1000.0


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "input"


def _daemon(
    ctx: Context,
    spec: JobSpec,
    entry: DataInput,
    location: StorageLocation,
    fs: ReadOnlyFS,
    stats: MountStats,
    mountpoint: Path,
    retry: RetryPolicy,
) -> mountd.MountDaemon:
    settings = ctx.settings
    name = _safe_name(entry.name)
    stats_file = settings.log_dir / f"mount-stats-{name}.json"
    uri = location.uri()
    state = mountd.MountState(
        pid=os.getpid(),
        mountpoint=str(mountpoint),
        spec=str(spec.source or ""),
        input=entry.name,
        uri=uri,
        started=time.time(),
        stats_file=str(stats_file),
    )
    config = mountd.DaemonConfig(
        mountpoint=mountpoint,
        fsname=f"datamount:{name}",
        ttl_seconds=attribute_ttl(settings),
        drain_timeout=settings.unmount_timeout_seconds,
        # One FUSE worker per concurrent storage read, at least libfuse's 10.
        max_threads=max(16, settings.read_threads),
        state=state,
        state_file=mountd.state_file(settings.cache_dir, mountpoint),
        stats_file=stats_file,
        allow_other=os.geteuid() == 0,
    )

    def snapshot() -> dict[str, Any]:
        return {
            "mountpoint": str(mountpoint),
            "input": entry.name,
            "uri": uri,
            "pid": os.getpid(),
            "updated": time.time(),
            # Retries happen in the store's policy, shared by every request.
            "cache": {**stats.snapshot(), "retries": retry.stats.retries},
            "fs": fs.counters(),
        }

    return mountd.MountDaemon(fs, config, snapshot)


# -- upload outputs and asset registration ---------------------------------------


def prepare_upload_output(ctx: Context, spec: JobSpec, entry: DataInput, folder: Path) -> Path:
    """An upload output: an empty local folder now, uploaded at `unmount`."""
    if entry.direction != "output":
        raise SpecError(f"inputs.{entry.name}: upload is an output mode")
    if spec.source is None:
        raise SpecError(f"outputs.{entry.name}: an upload output needs a spec file")
    workspace = ctx.load_workspace(required=False) or Workspace.empty()
    location = resolve_entry(spec, entry, workspace)  # fails now, not after the job
    if location.kind is StorageKind.HTTP:
        raise UriError(f"outputs.{entry.name}.path: cannot upload to a public http(s) URL")
    file_name = None
    if entry.type is DataType.URI_FILE:
        file_name = location.key.rstrip("/").rpartition("/")[2] or entry.name
    record = outputs.UploadOutput(
        mountpoint=mountd.mount_key(folder),
        spec=str(spec.source.resolve()),
        output=entry.name,
        workspace=str(workspace.source.resolve()) if workspace.source else None,
        file_name=file_name,
    )
    path = outputs.prepare(ctx.settings.cache_dir, record)
    log.info("outputs.%s: upload mode, local folder %s -> %s", entry.name, folder, location.uri())
    return path


def finish_upload_output(
    ctx: Context, record: outputs.UploadOutput, *, register: bool = True
) -> str:
    """Upload what the job wrote, register the asset (unless `register` is
    False), empty the local folder."""
    if record.workspace and not ctx.workspace_flag:
        ctx = dataclasses.replace(ctx, workspace_flag=record.workspace)
    spec = load_spec(Path(record.spec))
    entry = spec.entry(record.output)
    src = outputs.source(record)
    if record.file_name and not src.is_file():
        raise OutputError(f"outputs.{entry.name}: the job wrote no file at {src}")
    result = upload(ctx, src, record.spec, name=record.output, progress=None)
    registered = register_output(ctx, spec, entry) if register else None
    outputs.finish(ctx.settings.cache_dir, record)
    done = f"uploaded {result.files} files ({result.bytes} bytes)"
    return done + (f", registered {registered}" if registered else "")


def register_output(ctx: Context, spec: JobSpec, entry: DataInput) -> str | None:
    """Register `entry`'s asset (name, version) when it names one; 'name:version'."""
    if entry.asset_name is None:
        return None
    workspace = ctx.load_workspace(required=False)
    if workspace is None:
        raise OutputError(
            f"outputs.{entry.name}: registering data asset {entry.asset_name!r} needs a "
            f"workspace file ({ctx.workspace_path()} not found)"
        )
    try:
        version = registry.register(
            workspace, entry.asset_name, entry.asset_version, type_=entry.type.value,
            path=entry.path, description=entry.description, job=spec.name,
        )  # fmt: skip
    except InvalidInput as exc:
        raise OutputError(f"outputs.{entry.name}: {exc}") from None
    log.info("registered data asset %s:%s -> %s", entry.asset_name, version, entry.path)
    return f"{entry.asset_name}:{version}"


def unmount(
    ctx: Context, mountpoint: Path, *, timeout: float | None = None, register: bool = True
) -> str:
    """Drain and unmount a mount, or upload an upload output (registering its
    asset unless `register` is False); returns what was done."""
    settings = ctx.settings
    mountpoint = Path(mountd.mount_key(mountpoint))
    record = outputs.read_record(settings.cache_dir, mountpoint)
    if record is not None:
        with activity("unmount", mountpoint=mountpoint, mode="upload"):
            how = finish_upload_output(ctx, record, register=register)
        log.info("unmount %s: %s", mountpoint, how)
        return how
    wait = settings.unmount_timeout_seconds if timeout is None else timeout
    with activity("unmount", mountpoint=mountpoint):
        how = mountd.unmount(mountpoint, cache_dir=settings.cache_dir, timeout=wait)
    log.info("unmount %s: %s", mountpoint, how)
    return how
