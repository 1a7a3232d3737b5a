"""Composition root: builds the per-run objects (settings, workspace, stores)
from what the CLI parsed, and holds the operations the commands run: validate,
resolve, download / eval_download / upload, upload outputs and asset
registration. `mounting` (mount, unmount, the FUSE stacks) and `jobrun`
(whole jobs) build on it.

With them, the only modules that wire layers together; imported only by
`cli`, `mounting` and `jobrun`. No threads of its own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from datamount import registry
from datamount.errors import (
    DataError,
    InvalidInput,
    ObjectNotFound,
    OutputError,
    SpecError,
    StorageError,
    UriError,
)
from datamount.log import activity
from datamount.settings import Settings
from datamount.spec import DataInput, DataType, JobSpec, load_spec
from datamount.storage import ObjectStore, open_store
from datamount.storage.location import StorageKind, StorageLocation
from datamount.storage.retry import RetryPolicy
from datamount.transfer.download import Downloader, DownloadOptions, DownloadResult
from datamount.transfer.progress import Progress
from datamount.uris import LocationKind, parse
from datamount.workspace import Workspace, find_workspace

if TYPE_CHECKING:  # imported where used: `download` starts faster without them
    from datamount.mount import outputs
    from datamount.transfer.upload import UploadResult

log = logging.getLogger("datamount.app")


@dataclass(frozen=True)
class Context:
    """What every command gets: settings read once, and where to find the workspace."""

    settings: Settings
    environ: Mapping[str, str]
    cwd: Path
    workspace_flag: str | None = None
    run_name: str | None = None  # `run`: this run's unique name (default output paths)

    def load_spec(self, path: Path) -> JobSpec:
        return load_spec(path, run_name=self.run_name)

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
        spec = ctx.load_spec(spec_path)
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
        spec = ctx.load_spec(path)
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
        spec = ctx.load_spec(path)
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
    retry = make_retry(settings)
    with activity("download", source=tgt.label):
        store = make_store(settings, tgt.location, retry)

        def is_file() -> bool:
            return tgt.is_file if tgt.is_file is not None else _is_file(store, tgt.location)

        uri = tgt.location.uri()
        return _download(ctx, store, tgt.location.key, is_file, dest, retry, uri=uri,
                         source_id=uri, overwrite=overwrite, progress=progress)  # fmt: skip


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
    with activity("eval_download", source=f"inputs.{entry.name}"):
        from datamount.mltable import evalmode  # MLTable support (numpy, pyarrow): only when used

        store = evalmode.evaluated_store(
            location, workspace, lambda loc: make_store(settings, loc, retry)
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
) -> DownloadResult:
    """Run the Downloader over `key` of `store` (closed at the end); `uri`
    names the source in errors and logs, `source_id` in the resume manifest."""
    settings = ctx.settings
    try:
        options = DownloadOptions(
            threads=settings.downloader_threads,
            reserved_free_disk_space=settings.reserved_free_disk_space,
            overwrite=overwrite,
            fsync=settings.download_fsync,
            manifest_dir=settings.cache_dir / "manifests",
        )
        downloader = Downloader(store, options, progress)
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
            from datamount.transfer.upload import Uploader, UploadOptions

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


# -- upload outputs and asset registration ---------------------------------------


def prepare_upload_output(ctx: Context, spec: JobSpec, entry: DataInput, folder: Path) -> Path:
    """An upload output: an empty local folder now, uploaded at `unmount`."""
    from datamount.mount import control, outputs

    if entry.direction != "output":
        raise SpecError(f"inputs.{entry.name}: upload is an output mode")
    if spec.source is None:
        raise SpecError(f"outputs.{entry.name}: an upload output needs a spec file")
    workspace = ctx.load_workspace(required=False) or Workspace.empty()
    location = resolve_entry(spec, entry, workspace)  # fails now, not after the job
    if location.kind is StorageKind.HTTP:
        raise UriError(f"outputs.{entry.name}.path: cannot upload to a public http(s) URL")
    _check_destination(ctx, location, f"outputs.{entry.name}")
    file_name = None
    if entry.type is DataType.URI_FILE:
        file_name = location.key.rstrip("/").rpartition("/")[2] or entry.name
    record = outputs.UploadOutput(
        mountpoint=control.mount_key(folder),
        spec=str(spec.source.resolve()),
        output=entry.name,
        workspace=str(workspace.source.resolve()) if workspace.source else None,
        file_name=file_name,
        run_name=ctx.run_name,
    )
    path = outputs.prepare(ctx.settings.cache_dir, record)
    log.info("outputs.%s: upload mode, local folder %s -> %s", entry.name, folder, location.uri())
    return path


def _check_destination(ctx: Context, location: StorageLocation, label: str) -> None:
    """One listing request: the container exists and the credential reaches it
    (so a job learns before it runs, not after, that its output cannot land)."""
    if location.kind is StorageKind.LOCAL:
        return
    store = make_store(ctx.settings, location, make_retry(ctx.settings))
    try:
        prefix = location.key.rpartition("/")[0]
        next(iter(store.list_pages(prefix + "/" if prefix else "", delimiter="/")), None)
    except StorageError as exc:
        raise OutputError(f"{label}: cannot write to {location.uri()}: {exc}") from None
    finally:
        store.close()


def finish_upload_output(
    ctx: Context, record: outputs.UploadOutput, *, register: bool = True
) -> str:
    """Upload what the job wrote, register the asset (unless `register` is
    False), empty the local folder."""
    from datamount.mount import outputs

    if record.workspace and not ctx.workspace_flag:
        ctx = dataclasses.replace(ctx, workspace_flag=record.workspace)
    ctx = dataclasses.replace(ctx, run_name=record.run_name)
    spec = ctx.load_spec(Path(record.spec))
    entry = spec.entry(record.output)
    src = outputs.source(record)
    if not Path(record.mountpoint).is_dir():
        outputs.finish(ctx.settings.cache_dir, record)
        raise OutputError(
            f"outputs.{entry.name}: the local folder {record.mountpoint} is gone: nothing "
            "left to upload (its record is removed)"
        )
    if record.file_name and not src.is_file():
        raise OutputError(f"outputs.{entry.name}: the job wrote no file at {src}")
    result = upload(ctx, src, record.spec, name=record.output, progress=None)
    registered = register_output(ctx, spec, entry) if register else None
    outputs.finish(ctx.settings.cache_dir, record)
    done = f"uploaded {result.files} files ({result.bytes} bytes)"
    return done + (f", registered {registered}" if registered else "")


def _check_written(ctx: Context, spec: JobSpec, entry: DataInput, workspace: Workspace) -> None:
    """A uri_file output registers only a file that exists (one stat)."""
    location = resolve_entry(spec, entry, workspace)
    store = make_store(ctx.settings, location, make_retry(ctx.settings))
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
