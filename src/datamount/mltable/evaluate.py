"""Evaluate an MLTable's `paths` to a concrete, ordered list of files.

`evaluate(mltable_location, workspace, store_factory)` reads the MLTable file
(local or remote), resolves every path entry (relative paths against the
MLTable file's own folder, URIs through the workspace), lists folders and
patterns (a pattern lists only its longest fixed prefix), applies the
file-level `take` / `skip` / `take_random_sample` steps, drops duplicates and
keeps the order: entries in file order, files of one entry in key order.

`EvalFile.eval_path` (layout.py) is where a file lands in the eval_download /
eval_mount layout. Stores come from the caller's factory (the context's
`store`) and are closed when evaluation ends. Single-threaded.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

from datamount import yamlfile
from datamount.errors import DataError, ObjectNotFound, StorageError, UriError, WorkspaceError
from datamount.jobspec.uris import LocationKind, parse
from datamount.mltable import patterns
from datamount.mltable.layout import EvalFile, check_layout, eval_mltable_text, eval_relative_path
from datamount.mltable.model import MLTable, MLTableError, PathEntry, Step, parse_mltable
from datamount.storage import ObjectStore
from datamount.storage.location import StorageKind, StorageLocation
from datamount.workspace.datastores import Workspace

StoreFactory = Callable[[StorageLocation], ObjectStore]
# The workspace, asked for only when a path needs it (a local path never does:
# `load` then never reads a workspace file for a local MLTable of local files).
WorkspaceSource = Callable[[], Workspace]
MLTABLE_FILE = "MLTable"
MAX_MLTABLE_BYTES = 1 << 20  # an MLTable file is a few hundred bytes; refuse anything silly


class Stores:
    """One store per (store root, credential), opened on demand, closed together."""

    def __init__(self, factory: StoreFactory) -> None:
        self.factory = factory
        self._open: dict[tuple[str, object], ObjectStore] = {}

    def get(self, location: StorageLocation) -> ObjectStore:
        ident = (location.store_root, location.credential)
        store = self._open.get(ident)
        if store is None:
            store = self._open[ident] = self.factory(location)
        return store

    def close(self) -> None:
        for store in self._open.values():
            with contextlib.suppress(Exception):
                store.close()
        self._open.clear()

    def __enter__(self) -> Stores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the MLTable file --------------------------------------------------------


def locate(
    path_or_uri: str | os.PathLike[str] | StorageLocation,
    workspace: WorkspaceSource,
    base_dir: Path | None = None,
) -> StorageLocation:
    """The location of a path or URI naming an MLTable folder or file."""
    if isinstance(path_or_uri, StorageLocation):
        return path_or_uri
    if isinstance(path_or_uri, os.PathLike):
        path_or_uri = os.fspath(path_or_uri)
    loc = parse(path_or_uri, "mltable")
    ws = Workspace.empty() if loc.kind is LocationKind.LOCAL else workspace()
    return ws.resolve(loc, where="mltable", base_dir=base_dir, expected_type="mltable")


def read_mltable(location: StorageLocation, stores: Stores) -> tuple[MLTable, StorageLocation]:
    """Find and parse the MLTable file at `location` (its folder or the file
    itself). Returns the table and the location of its folder (ends in '/')."""
    file_loc = _mltable_file(location, stores)
    shown = file_loc.uri()
    store = stores.get(file_loc)
    try:
        info = store.stat(file_loc.key)
        if info.is_dir:
            raise MLTableError(f"MLTable {shown}: is a folder, not a file")
        if info.size > MAX_MLTABLE_BYTES:
            raise MLTableError(f"MLTable {shown}: {info.size} bytes is too large for an MLTable")
        data = store.read(file_loc.key, 0, info.size, etag=info.etag)
    except ObjectNotFound:
        raise DataError(f"MLTable {shown}: no MLTable file there") from None
    except StorageError as exc:
        raise DataError(f"MLTable {shown}: cannot read it: {exc}") from None
    table = parse_mltable(yamlfile.decode(data, f"MLTable {shown}", MLTableError), shown)
    parent = posixpath.dirname(file_loc.path.rstrip("/"))
    folder = replace(file_loc, path=parent + "/" if parent else "")
    return table, folder


def _mltable_file(location: StorageLocation, stores: Stores) -> StorageLocation:
    if location.kind is StorageKind.HTTP:
        parts = urlsplit(location.path)
        if parts.path.endswith("/") and not parts.query:  # a folder URL: its MLTable file
            return replace(location, path=location.path + MLTABLE_FILE)
        return location
    if location.kind is StorageKind.LOCAL:
        path = location.path.rstrip("/") or "/"
        if os.path.isdir(path):
            return replace(location, path=os.path.join(path, MLTABLE_FILE))
        return replace(location, path=path)
    if location.is_folder:
        return location.child(MLTABLE_FILE)
    if posixpath.basename(location.path) == MLTABLE_FILE:
        return location
    try:  # a blob URI without a trailing '/': a file if one is there, else a folder
        info = stores.get(location).stat(location.key)
        if not info.is_dir:
            return location
    except ObjectNotFound:
        pass
    except StorageError as exc:
        raise DataError(f"MLTable {location.uri()}: cannot read it: {exc}") from None
    return location.child(MLTABLE_FILE)


# -- path entries ------------------------------------------------------------


def resolve_entry(
    entry: PathEntry, table: MLTable, folder: StorageLocation, workspace: WorkspaceSource
) -> StorageLocation:
    """Where a `paths` entry points: a relative path is resolved against the
    MLTable file's folder (local or remote), anything else through the workspace.
    A remote MLTable (blob, ADLS, http) may only point at remote storage."""
    where = f"MLTable {table.source}: {entry.where}.{entry.kind}"
    value = entry.value
    if entry.kind == "pattern" and "://" in value:
        # '?' is a wildcard here, not a query: escape it through the URI parser
        # (which percent-decodes storage paths back to '?').
        value = value.replace("?", "%3F")
    try:
        loc = parse(value, where)
    except UriError as exc:
        raise MLTableError(exc.problems) from None
    if loc.kind is LocationKind.LOCAL and not os.path.isabs(loc.path):
        resolved = _relative(entry, loc.path, table, folder, where)
    else:
        ws = Workspace.empty() if loc.kind is LocationKind.LOCAL else workspace()
        try:
            resolved = ws.resolve(loc, where=where)
        except WorkspaceError as exc:
            raise MLTableError(exc.problems) from None
    if resolved.kind is StorageKind.LOCAL and folder.kind is not StorageKind.LOCAL:
        # Whoever can write a blob must not be able to pull node files
        # (/proc/<pid>/environ, mounted secrets) into a job's input. Checked on
        # the resolved location, so a data asset with a local path is caught too.
        raise MLTableError(
            f"{where}: {entry.value!r}: a remote MLTable cannot reference local files"
        )
    return resolved


def _relative(
    entry: PathEntry, rel: str, table: MLTable, folder: StorageLocation, where: str
) -> StorageLocation:
    trailing = "/" if rel.endswith("/") else ""
    if folder.kind is StorageKind.LOCAL:
        path = os.path.normpath(os.path.join(folder.path, rel))
        return replace(folder, path=path + trailing if path != "/" else "/")
    if folder.kind is StorageKind.HTTP:
        raise MLTableError(f"{where}: {rel!r}: relative paths need an MLTable on storage")
    parts: list[str] = []
    for part in [*folder.path.split("/"), *rel.split("/")]:
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise MLTableError(f"{where}: {rel!r} leads outside the container")
            parts.pop()
        else:
            parts.append(part)
    joined = "/".join(parts)
    return replace(folder, path=joined + trailing if joined else "")


def _files(
    entry: PathEntry, loc: StorageLocation, stores: Stores, where: str
) -> Iterator[tuple[StorageLocation, int, str]]:
    """(location, size, etag) of every file an entry names, in key order."""
    store = stores.get(loc)
    if entry.kind == "file":
        if loc.kind is StorageKind.LOCAL and os.path.isdir(loc.path):
            raise DataError(f"{where}: {entry.value!r} is a folder; use folder:")
        info = store.stat(loc.key)
        if info.is_dir:
            raise DataError(f"{where}: {entry.value!r} is a folder; use folder:")
        yield loc, info.size, info.etag
        return
    if loc.kind is StorageKind.HTTP:
        raise DataError(f"{where}: {entry.value!r}: an http(s) URL can only be a file: entry")
    key = loc.key
    if entry.kind == "folder":
        prefix = key if key.endswith("/") or not key else key + "/"
        if loc.kind is StorageKind.LOCAL:
            prefix = prefix if prefix.endswith("/") else prefix + "/"
        for page in store.list_pages(prefix):
            for obj in page.objects:
                if not obj.is_dir and not obj.key.endswith("/"):
                    yield _at(loc, obj.key), obj.size, obj.etag
        return
    regex = patterns.compile_glob(key)
    prefix = patterns.fixed_prefix(key)
    delimiter = None if patterns.needs_recursion(key) else "/"
    for page in store.list_pages(prefix, delimiter=delimiter):
        for obj in page.objects:
            if not obj.is_dir and regex.match(obj.key):
                yield _at(loc, obj.key), obj.size, obj.etag


def _at(loc: StorageLocation, key: str) -> StorageLocation:
    path = "/" + key if loc.kind is StorageKind.LOCAL else key
    return replace(loc, path=path)


def list_files(
    table: MLTable, folder: StorageLocation, workspace: WorkspaceSource, stores: Stores
) -> list[EvalFile]:
    """Every file of every entry, duplicates dropped, order kept (no subsetting)."""
    out: list[EvalFile] = []
    seen: set[tuple[str, str]] = set()
    for entry in table.paths:
        where = f"MLTable {table.source}: {entry.where}"
        loc = resolve_entry(entry, table, folder, workspace)
        count = 0
        try:
            for file_loc, size, etag in _files(entry, loc, stores, where):
                count += 1
                ident = (file_loc.store_root, file_loc.key)
                if ident in seen:
                    continue
                seen.add(ident)
                rel = eval_relative_path(file_loc, folder)
                out.append(EvalFile(file_loc, size, etag, entry.where, rel))
        except ObjectNotFound:
            raise DataError(f"{where}: {entry.kind} {entry.value!r} not found") from None
        except StorageError as exc:
            raise DataError(f"{where}: {entry.kind} {entry.value!r}: {exc}") from None
        if count == 0:
            what = "matches no file" if entry.kind == "pattern" else "holds no file"
            raise DataError(f"{where}: {entry.kind} {entry.value!r} {what}")
    return out


def subset(items: list[EvalFile], steps: list[Step]) -> list[EvalFile]:
    """Apply file-level take / skip / take_random_sample in order."""
    for step in steps:
        if step.name == "take":
            items = items[: step.args]
        elif step.name == "skip":
            items = items[step.args :]
        elif step.name == "take_random_sample":
            keep = sample_mask(len(items), step.args.probability, step.args.seed)
            items = [f for f, k in zip(items, keep, strict=True) if k]
    return items


def sample_mask(n: int, probability: float, seed: int | None) -> np.ndarray:
    """Item i is kept when the i-th draw of numpy's default_rng(seed) is below
    `probability`: the same seed always keeps the same items (no seed: random)."""
    return np.random.default_rng(seed).random(n) < probability


def evaluate(
    mltable_location: str | os.PathLike[str] | StorageLocation,
    workspace: Workspace | None,
    store_factory: StoreFactory,
    *,
    base_dir: Path | None = None,
) -> list[EvalFile]:
    """The files of the MLTable at `mltable_location` (its folder or the
    MLTable file; a path/URI or an already resolved StorageLocation), after
    file-level subsetting. Raises MLTableError (malformed, exit 2) or
    DataError (missing or unreadable data, exit 3)."""
    return evaluate_table(mltable_location, workspace, store_factory, base_dir=base_dir)[1]


def evaluate_table(
    mltable_location: str | os.PathLike[str] | StorageLocation,
    workspace: Workspace | None,
    store_factory: StoreFactory,
    *,
    base_dir: Path | None = None,
) -> tuple[MLTable, list[EvalFile], str]:
    """`evaluate`, plus the parsed MLTable and the MLTable text for the eval layout."""
    ws = workspace or Workspace.empty()
    location = locate(mltable_location, lambda: ws, base_dir)
    with Stores(store_factory) as stores:
        table, folder = read_mltable(location, stores)
        files = subset(list_files(table, folder, lambda: ws, stores), table.file_steps())
    check_layout(table, files)
    return table, files, eval_mltable_text(table, files)
