"""Composition root, the mount side: `mount` (the sidecar entry point, every
mode of the Azure ML table) and `unmount`, the FUSE daemons they start and the
read/write stacks those serve. Imported only by `cli` and `jobrun`; builds on
`app` (settings, workspace, stores, transfers, upload outputs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamount.app import (
    Context,
    download,
    eval_download,
    finish_upload_output,
    make_retry,
    make_store,
    prepare_upload_output,
    resolve_entry,
)
from datamount.errors import (
    DataError,
    DatamountError,
    ObjectNotFound,
    OutputError,
    SpecError,
    StorageError,
    UriError,
)
from datamount.fs.namespace import Namespace
from datamount.fs.ops import ReadOnlyFS
from datamount.log import RUNTIME_LOG, activity
from datamount.mount import control, outputs
from datamount.mount.daemon import DaemonConfig, MountDaemon
from datamount.mount.stack import build_reader
from datamount.read.reader import Reader
from datamount.read.stats import MountStats
from datamount.settings import Settings
from datamount.spec import DataInput, DataType, JobSpec, Mode
from datamount.storage import ObjectStore
from datamount.storage.base import ListPage
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy
from datamount.transfer.progress import Progress
from datamount.workspace import Workspace

log = logging.getLogger("datamount.mounting")


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
    readiness = control.Readiness(ready_fd)
    launch = _Launch(foreground, daemon_argv, readiness, on_ready)
    try:
        spec = ctx.load_spec(spec_path)
        entry = spec.entry(name)
        mountpoint = Path(control.mount_key(mountpoint))  # every mode prints an absolute path
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
            return _rw_mount(ctx, spec, entry, mountpoint, launch)
        if entry.mode not in (Mode.RO_MOUNT, Mode.EVAL_MOUNT):
            raise DatamountError(
                f"{entry.direction}s.{entry.name}: mode {entry.mode.value} is not available"
            )
        if entry.direction != "input":
            raise SpecError(f"outputs.{entry.name}: {entry.mode.value} is an input mode")
        return _ro_mount(ctx, spec, entry, mountpoint, launch)
    except DatamountError as exc:
        readiness.fail(exc)
        raise


@dataclass(frozen=True)
class _Launch:
    """How a FUSE mount is started: in a background daemon (`daemon_argv`,
    this process returns once it answers) or served here (`foreground`; the
    spawned daemon itself has `readiness`, its end of the handshake)."""

    foreground: bool
    daemon_argv: list[str] | None
    readiness: control.Readiness
    on_ready: Callable[[Path], None] | None

    def spawn(self, ctx: Context, mountpoint: Path, what: str) -> int:
        """Start the daemon (with the context's environment: a job's
        environment_variables tune it too); returns once the mount answers."""
        if self.daemon_argv is None:
            raise DatamountError("mount: no daemon command to start")
        log_file = ctx.settings.log_dir / RUNTIME_LOG
        pid = control.spawn(self.daemon_argv, mountpoint=mountpoint, log_file=log_file,
                           env=ctx.environ)  # fmt: skip
        log.info("%s at %s (daemon pid %d)", what, mountpoint, pid)
        return pid

    def serve(self, daemon: MountDaemon, path: Path) -> None:
        """The mount answers: tell whoever waits, then serve until unmounted."""
        self.readiness.ok()
        if self.on_ready is not None:
            self.on_ready(path)
        daemon.run()


def _ro_mount(
    ctx: Context, spec: JobSpec, entry: DataInput, mountpoint: Path, launch: _Launch
) -> Path:
    """ro_mount, and eval_mount: the same read-only stack over the evaluated
    MLTable's files (evalmode.evaluated_store), evaluated by the process that
    serves the mount (a failure comes back through the start-up handshake)."""
    settings = ctx.settings
    mountpoint = Path(control.mount_key(mountpoint))
    workspace = ctx.load_workspace(required=False) or Workspace.empty()
    location = resolve_entry(spec, entry, workspace)
    is_file = entry.type is DataType.URI_FILE
    evaluated = entry.mode is Mode.EVAL_MOUNT
    label = f"inputs.{entry.name}"
    # The user-facing process records the activity; the daemon it spawns does not.
    recording = launch.readiness.fd is None
    with contextlib.ExitStack() as cleanup:
        recorder = activity("mount", input=label, mountpoint=mountpoint, mode=entry.mode.value)
        with recorder if recording else contextlib.nullcontext():
            control.prepare_mountpoint(mountpoint, settings.cache_dir)
            retry = make_retry(settings)
            store: ObjectStore | None = None
            if not evaluated:
                store = make_store(settings, location, retry)
                cleanup.callback(store.close)
                _check_source(store, location, is_file)
            path = (
                mountpoint / location.key.rstrip("/").rpartition("/")[2] if is_file else mountpoint
            )
            if not launch.foreground:
                launch.spawn(ctx, mountpoint, f"mounted {location.uri()}")
                return path
            root: str | None = None
            if store is None:
                from datamount.mltable import evalmode  # numpy, pyarrow: only when used

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
        launch.serve(daemon, path)
        return path


# Attributes of an rw_mount expire after 2 s when DATASET_MOUNT_ATTRIBUTE_CACHE_TTL
# is unset: other writers' changes show up soon; a mount's own writes
# invalidate its caches at once.
RW_ATTRIBUTE_TTL_MS = 2000


def _rw_mount(
    ctx: Context, spec: JobSpec, entry: DataInput, mountpoint: Path, launch: _Launch
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
    mountpoint = Path(control.mount_key(mountpoint))
    workspace = ctx.load_workspace(required=False) or Workspace.empty()
    location = resolve_entry(spec, entry, workspace)
    if location.kind is StorageKind.HTTP:
        raise UriError(f"{label}: cannot write to a public http(s) URL")
    if is_file and (location.is_folder or not location.key.strip("/")):
        raise SpecError(f"{label}: a uri_file path must name a file, not a folder")
    # A uri_file shows as MOUNTPOINT/<its name>, the only name in the mount.
    path = mountpoint / location.key.rpartition("/")[2] if is_file else mountpoint
    recording = launch.readiness.fd is None
    with contextlib.ExitStack() as cleanup:
        recorder = activity("mount", output=label, mountpoint=mountpoint)
        with recorder if recording else contextlib.nullcontext():
            control.prepare_mountpoint(mountpoint, settings.cache_dir)
            retry = make_retry(settings)
            store = make_store(settings, location, retry)
            cleanup.callback(store.close)
            try:  # credentials and container checked before anything is mounted
                prefix = location.key.rpartition("/")[0] if is_file else location.key
                next(iter(store.list_pages(prefix, delimiter="/")), None)
            except StorageError as exc:
                raise OutputError(f"cannot reach {location.uri()}: {exc}") from None
            if not launch.foreground:
                launch.spawn(ctx, mountpoint, f"rw-mounted {location.uri()}")
                return path
            from datamount.fs.writable import WritableFS  # rw only: ro daemons start faster
            from datamount.write.writeback import WriteBack, WriteBackOptions

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
            daemon = _daemon(
                ctx, spec, entry, location, fs, stats, mountpoint, retry, staging=staging
            )
            daemon.start()
        launch.serve(daemon, path)
        if daemon.leftovers:
            raise OutputError(f"{label}: {daemon.leftovers.describe(str(staging))}")
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
    *,
    staging: Path | None = None,
) -> MountDaemon:
    """The daemon of one mount; `staging` is an rw_mount's staging folder,
    recorded in its state so that `unmount` can name what a dead daemon left."""
    settings = ctx.settings
    name = _safe_name(entry.name)
    stats_file = control.stats_path(settings.log_dir, entry.name, mountpoint)
    uri = location.uri()
    state = control.MountState(
        pid=os.getpid(),
        mountpoint=str(mountpoint),
        spec=str(spec.source or ""),
        input=entry.name,
        uri=uri,
        started=time.time(),
        stats_file=str(stats_file),
        mode=entry.mode.value,
        staging=str(staging or ""),
    )
    config = DaemonConfig(
        mountpoint=mountpoint,
        fsname=f"datamount:{name}",
        ttl_seconds=attribute_ttl(settings),
        drain_timeout=settings.unmount_timeout_seconds,
        # One FUSE worker per concurrent storage read, at least libfuse's 10.
        max_threads=max(16, settings.read_threads),
        state=state,
        state_file=control.state_file(settings.cache_dir, mountpoint),
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

    return MountDaemon(fs, config, snapshot)


def unmount(
    ctx: Context, mountpoint: Path, *, timeout: float | None = None, register: bool = True
) -> str:
    """Drain and unmount a mount, or upload an upload output (registering its
    asset unless `register` is False); returns what was done."""
    settings = ctx.settings
    mountpoint = Path(control.mount_key(mountpoint))
    if outputs.read_record(settings.cache_dir, mountpoint) is not None:
        with outputs.claimed(settings.cache_dir, mountpoint) as record:
            if record is None:
                return "already uploaded (by another unmount)"
            with activity("unmount", mountpoint=mountpoint, mode="upload"):
                how = finish_upload_output(ctx, record, register=register)
        log.info("unmount %s: %s", mountpoint, how)
        return how
    wait = settings.unmount_timeout_seconds if timeout is None else timeout
    with activity("unmount", mountpoint=mountpoint):
        how = control.unmount(mountpoint, cache_dir=settings.cache_dir, timeout=wait)
    log.info("unmount %s: %s", mountpoint, how)
    return how
