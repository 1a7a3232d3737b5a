"""The `upload` output mode, and asset registration for every output mode.

prepare: the destination is resolved and reached (one listing request) before
the job starts, then the folder is made empty and recorded (modes/upload_records.py).
finish (`unmount FOLDER`): upload what the job wrote, register the asset,
empty the folder; a failed upload keeps both, so the unmount can run again.

No threads.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from datamount.errors import (
    InvalidInput,
    ObjectNotFound,
    OutputError,
    SpecError,
    StorageError,
    UriError,
)
from datamount.jobspec.job import DataInput, DataType, JobSpec
from datamount.log import activity
from datamount.modes import upload_records
from datamount.modes.context import Context, Target
from datamount.modes.download import upload_target
from datamount.modes.handler import How
from datamount.storage.location import StorageKind, StorageLocation
from datamount.transfer.uploader import BadName
from datamount.workspace import registry
from datamount.workspace.datastores import Workspace

log = logging.getLogger("datamount.app")


class UploadHandler:
    directions: tuple[str, ...] = ("output",)
    keeps_folder: bool = True

    def prepare(
        self, ctx: Context, spec: JobSpec, entry: DataInput, folder: Path, how: How
    ) -> Path:
        """An empty local folder now, uploaded at `unmount`."""
        if spec.source is None:
            raise SpecError(f"outputs.{entry.name}: an upload output needs a spec file")
        location = ctx.resolve(spec, entry)  # fails now, not after the job
        if location.kind is StorageKind.HTTP:
            raise UriError(f"outputs.{entry.name}.path: cannot upload to a public http(s) URL")
        _check_destination(ctx, location, f"outputs.{entry.name}")
        file_name = None
        if entry.type is DataType.URI_FILE:
            file_name = location.key.rstrip("/").rpartition("/")[2] or entry.name
        workspace = ctx.workspace()
        record = upload_records.UploadOutput(
            mountpoint=str(folder),
            spec=str(spec.source.resolve()),
            output=entry.name,
            workspace=str(workspace.source.resolve()) if workspace.source else None,
            file_name=file_name,
            run_name=ctx.run_name,
        )
        path = upload_records.prepare(ctx.settings.cache_dir, record)
        log.info(
            "outputs.%s: upload mode, local folder %s -> %s", entry.name, folder, location.uri()
        )
        return path

    def finish(self, ctx: Context, folder: Path, *, timeout: float | None, register: bool) -> str:
        with upload_records.claimed(ctx.settings.cache_dir, folder) as record:
            if record is None:
                return "already uploaded (by another unmount)"
            with activity("unmount", mountpoint=folder, mode="upload"):
                how = _finish(ctx, record, register=register)
        log.info("unmount %s: %s", folder, how)
        return how


def _check_destination(ctx: Context, location: StorageLocation, label: str) -> None:
    """One listing request: the container exists and the credential reaches it
    (so a job learns before it runs, not after, that its output cannot land)."""
    if location.kind is StorageKind.LOCAL:
        return
    store = ctx.store(location, ctx.retry())
    try:
        prefix = location.key.rpartition("/")[0]
        next(iter(store.list_pages(prefix + "/" if prefix else "", delimiter="/")), None)
    except StorageError as exc:
        raise OutputError(f"{label}: cannot write to {location.uri()}: {exc}") from None
    finally:
        store.close()


def _finish(ctx: Context, record: upload_records.UploadOutput, *, register: bool) -> str:
    """Upload what the job wrote, register the asset (unless `register` is
    False), empty the local folder."""
    if record.workspace and not ctx.workspace_flag:
        ctx = dataclasses.replace(ctx, workspace_flag=record.workspace)
    ctx = dataclasses.replace(ctx, run_name=record.run_name)
    spec = ctx.load_spec(Path(record.spec))
    entry = spec.entry(record.output)
    src = upload_records.source(record)
    if not Path(record.mountpoint).is_dir():
        upload_records.finish(ctx.settings.cache_dir, record)
        raise OutputError(
            f"outputs.{entry.name}: the local folder {record.mountpoint} is gone: nothing "
            "left to upload (its record is removed)"
        )
    if record.file_name and not src.is_file():
        raise OutputError(f"outputs.{entry.name}: the job wrote no file at {src}")
    location = ctx.resolve(spec, entry)
    tgt = Target(location, entry.type is DataType.URI_FILE, f"outputs.{entry.name}")
    try:
        result = upload_target(ctx, src, tgt)
    except BadName as exc:  # the folder and its record stay: rename, then unmount again
        raise OutputError(f"outputs.{entry.name}: {exc}") from None
    registered = register_output(ctx, spec, entry) if register else None
    upload_records.finish(ctx.settings.cache_dir, record)
    done = f"uploaded {result.files} files ({result.bytes} bytes)"
    return done + (f", registered {registered}" if registered else "")


def _check_written(ctx: Context, spec: JobSpec, entry: DataInput, workspace: Workspace) -> None:
    """A uri_file output registers only a file that exists (one stat)."""
    location = ctx.resolve(spec, entry)
    store = ctx.store(location, ctx.retry())
    try:
        store.stat(location.key)
    except ObjectNotFound:
        raise OutputError(
            f"outputs.{entry.name}: the job wrote no file at {location.uri()}; "
            f"data asset {entry.asset_name!r} not registered"
        ) from None
    except StorageError as exc:
        raise OutputError(f"outputs.{entry.name}: cannot check {location.uri()}: {exc}") from None
    finally:
        store.close()


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
    if entry.type is DataType.URI_FILE:
        _check_written(ctx, spec, entry, workspace)
    try:
        version = registry.register(
            workspace, entry.asset_name, entry.asset_version, type_=entry.type.value,
            path=entry.path, description=entry.description, job=ctx.run_name or spec.name,
        )  # fmt: skip
    except InvalidInput as exc:
        raise OutputError(f"outputs.{entry.name}: {exc}") from None
    log.info("registered data asset %s:%s -> %s", entry.asset_name, version, entry.path)
    return f"{entry.asset_name}:{version}"
