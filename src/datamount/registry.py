"""Data asset registration: the versions jobs add to the workspace registry.

Assets declared by hand live in the workspace file (`data_assets:`), which
holds comments and `${VAR}` references datamount must never rewrite. Versions
registered by jobs go to a second file next to it — `<stem>.assets.yaml`, or
the workspace's `registry_file:` — which `Workspace.load` merges in.

Registration is atomic and safe between processes on one node: under an
exclusive `flock` on `<registry>.lock`, the registry is re-read, the name and
version checked against both files, and the new content written to a
temporary file that is fsync'd and renamed over the old one. Two jobs
registering at once both land; a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from datamount.errors import WorkspaceError
from datamount.uris import ASSET_NAME
from datamount.workspace import Workspace, read_registry, registry_path, version_key

HEADER = (
    "# Data asset versions registered by datamount jobs (merged into the workspace).\n"
    "# Written atomically under a lock; edit only while no job runs.\n"
)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def next_version(versions: list[str]) -> str:
    """One more than the highest numeric version ('1' for a new asset)."""
    numbers = [int(v) for v in versions if v.isdigit()]
    return str(max(numbers, default=0) + 1)


def register(
    workspace: Workspace,
    name: str,
    version: str | None,
    *,
    type_: str,
    path: str,
    description: str | None = None,
    job: str | None = None,
) -> str:
    """Register `name` (at `version`, or the next number) pointing at `path`;
    returns the version. An existing name+version is a WorkspaceError."""
    if workspace.source is None:
        raise WorkspaceError(
            f"data asset {name!r}: registering needs a workspace file "
            "(--workspace FILE or DATAMOUNT_WORKSPACE)"
        )
    if not ASSET_NAME.fullmatch(name):
        raise WorkspaceError(
            f"data asset name {name!r}: not a data asset name (letters, digits, '_', '-', '.')"
        )
    target = registry_path(workspace.source, workspace.config)
    declared = [v.version for v in workspace.declared_versions(name)]
    with _locked(target):
        registry = read_registry(target)
        entries = registry.setdefault(name, [])
        taken = declared + [str(e.get("version")) for e in entries]
        chosen = version if version is not None else next_version(taken)
        if chosen in taken:
            raise WorkspaceError(
                f"data asset {name}:{chosen} is already registered; choose another version "
                "or leave it out to take the next one"
            )
        entry: dict[str, Any] = {"version": chosen, "type": type_, "path": path}
        if description:
            entry["description"] = description
        if job:
            entry["job"] = job
        entry["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        entries.append(entry)
        entries.sort(key=lambda e: version_key(str(e.get("version"))))
        body = yaml.safe_dump({"data_assets": registry}, sort_keys=True, allow_unicode=True)
        _write_atomic(target, HEADER + body)
    return chosen
