"""The FUSE modes: ro_mount, eval_mount (the read-only stack over the
evaluated MLTable's files) and rw_mount (plus write-back staging).

prepare, in the user-facing process, once: resolve the entry, check the
source (or, for rw_mount, that the destination is reachable), evaluate the
MLTable (eval_mount), clear the mount point, and write it all into a
`MountPlan`; then hand the plan to a daemon over its start-up channel and
return once the mount answers (mount.control.spawn), or serve it here
(`How.foreground`). The daemon builds its stack from the plan alone, with an
environment stripped of the variables the workspace file reads.
finish: drain and unmount (mount.control.unmount).

No threads.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path

from datamount.errors import (
    DataError,
    ObjectNotFound,
    OutputError,
    SpecError,
    StorageError,
    UriError,
)
from datamount.jobspec.job import DataInput, DataType, JobSpec, Mode
from datamount.log import RUNTIME_LOG, activity
from datamount.modes.context import Context
from datamount.modes.handler import How
from datamount.mount import control
from datamount.mount.plan import EvalFile, MountPlan
from datamount.mount.stack import RW_ATTRIBUTE_TTL_MS, staging_folder
from datamount.storage import ObjectStore
from datamount.storage.base import ListPage
from datamount.storage.location import StorageKind, StorageLocation

log = logging.getLogger("datamount.mounting")


class MountHandler:
    # ro_mount and eval_mount are input modes, rw_mount an output mode (spec.ALLOWED_MODES).
    directions: tuple[str, ...] = ("input", "output")
    keeps_folder: bool = True

    def prepare(
        self, ctx: Context, spec: JobSpec, entry: DataInput, folder: Path, how: How
    ) -> Path:
        writable = entry.mode is Mode.RW_MOUNT
        if not writable and entry.direction != "input":
            raise SpecError(f"outputs.{entry.name}: {entry.mode.value} is an input mode")
        settings = ctx.settings
        if writable and settings.attribute_cache_ttl_ms is None:
            settings = settings.model_copy(update={"attribute_cache_ttl_ms": RW_ATTRIBUTE_TTL_MS})
        location = ctx.resolve(spec, entry)
        is_file = entry.type is DataType.URI_FILE
        plan = MountPlan(
            mode=entry.mode.value, name=entry.name, direction=entry.direction,
            spec=str(spec.source or ""), mountpoint=folder, location=location,
            is_file=is_file, settings=settings,
        )  # fmt: skip
        if writable:
            if location.kind is StorageKind.HTTP:
                raise UriError(f"{plan.label}: cannot write to a public http(s) URL")
            if is_file and (location.is_folder or not location.key.strip("/")):
                raise SpecError(f"{plan.label}: a uri_file path must name a file, not a folder")
            plan = dataclasses.replace(plan, staging=staging_folder(settings, location))
            recorder = activity("mount", output=plan.label, mountpoint=folder)
        else:
            recorder = activity("mount", input=plan.label, mountpoint=folder, mode=plan.mode)
        with recorder:  # ends once the mount answers (a foreground mount is served after)
            control.prepare_mountpoint(folder, settings.cache_dir, settings.log_dir)
            if entry.mode is Mode.EVAL_MOUNT:
                plan = _evaluated(ctx, plan)
            elif writable:
                _check_destination(ctx, location, is_file)
            else:
                plan = _check_source(ctx, plan)
            if not how.foreground:
                _spawn(ctx, plan)
                return plan.path
            os.environ.update(control.DAEMON_ENV)  # this process is the daemon
            from datamount.mount import serve  # the stack's modules: only where served

            served = serve.start(plan)
        serve.run(served, control.Readiness(None), on_ready=how.on_ready)
        return plan.path

    def finish(self, ctx: Context, folder: Path, *, timeout: float | None, register: bool) -> str:
        settings = ctx.settings
        wait = settings.unmount_timeout_seconds if timeout is None else timeout
        with activity("unmount", mountpoint=folder):
            how = control.unmount(folder, cache_dir=settings.cache_dir, timeout=wait)
        log.info("unmount %s: %s", folder, how)
        return how


def _spawn(ctx: Context, plan: MountPlan) -> None:
    """Start the daemon, under its supervisor (mount.supervise: it restarts a
    daemon that dies), with the plan on its start-up channel; returns once
    the mount answers. Its environment is this one (a job's
    environment_variables tune it too) without the workspace's variables:
    the plan already holds the credentials they gave; plus DAEMON_ENV."""
    secrets = ctx.secret_variables()
    env = {k: v for k, v in ctx.environ.items() if k not in secrets} | control.DAEMON_ENV
    argv = [sys.executable, "-m", "datamount.mount.supervise", str(plan.mountpoint)]
    log_file = plan.settings.log_dir / RUNTIME_LOG
    pid = control.spawn(argv, mountpoint=plan.mountpoint, log_file=log_file, env=env,
                        plan=plan.to_json())  # fmt: skip
    what = "rw-mounted" if plan.staging else "mounted"
    log.info("%s %s at %s (daemon pid %d)", what, plan.location.uri(), plan.mountpoint, pid)


def _evaluated(ctx: Context, plan: MountPlan) -> MountPlan:
    """eval_mount: the MLTable evaluated here, once; the daemon gets its files."""
    from datamount.mltable import evalmode  # numpy, pyarrow: only when used

    retry = ctx.retry()
    files, text = evalmode.evaluate_files(
        plan.location, ctx.workspace(), lambda loc: ctx.store(loc, retry)
    )
    listed = [EvalFile(f.eval_path, f.location, f.size, f.etag) for f in files]
    return dataclasses.replace(plan, eval_files=listed, eval_text=text)


def _check_destination(ctx: Context, location: StorageLocation, is_file: bool) -> None:
    """rw_mount: credentials and container checked before anything is mounted."""
    store = ctx.store(location, ctx.retry())
    try:
        prefix = location.key.rpartition("/")[0] if is_file else location.key
        next(iter(store.list_pages(prefix, delimiter="/")), None)
    except StorageError as exc:
        raise OutputError(f"cannot reach {location.uri()}: {exc}") from None
    finally:
        store.close()


def _check_source(ctx: Context, plan: MountPlan) -> MountPlan:
    """The data exists (before anything is mounted): DataError otherwise. The
    plan, its read threads sized to the store's round trip (Context.in_flight)."""
    store = ctx.store(plan.location, ctx.retry())
    settings = plan.settings
    try:
        _check(store, plan.location, plan.is_file)
        try:
            threads = ctx.in_flight(
                store, plan.location.key, "DATASET_MOUNT_READ_THREADS", settings.read_threads
            )
        except StorageError as exc:  # the source answered its check: the default then
            log.warning("%s: the round trip could not be timed: %s", plan.location.uri(), exc)
            threads = settings.read_threads
    finally:
        store.close()
    if threads == settings.read_threads:
        return plan
    return dataclasses.replace(plan, settings=settings.model_copy(update={"read_threads": threads}))


def _check(store: ObjectStore, location: StorageLocation, is_file: bool) -> None:
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
