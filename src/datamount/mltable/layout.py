"""Where evaluated files land: `EvalFile` (one file of an evaluated MLTable and
its path in the eval_download / eval_mount layout), the layout's own MLTable
text, and the check that every file gets a path of its own inside the layout.

Pure: no I/O.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from datamount.errors import DataError
from datamount.mltable.model import PARTITION_STEP, MLTable
from datamount.storage.location import StorageKind, StorageLocation


@dataclass(frozen=True)
class EvalFile:
    """One file of an evaluated MLTable.

    `location` reads it (kind, account, container, endpoint, credential;
    `location.key` is its key in the store `store_factory(location)` opens);
    `etag` pins the version seen when listing. `account`/`container` are
    empty for local and http files; `path` is the blob name, the absolute
    local path, or the URL.
    """

    location: StorageLocation
    size: int
    etag: str
    entry: str  # the paths[i] entry that produced it
    eval_path: str  # relative path in the eval_download / eval_mount layout

    @property
    def account(self) -> str:
        return self.location.account

    @property
    def container(self) -> str:
        return self.location.container

    @property
    def path(self) -> str:
        return self.location.path

    @property
    def key(self) -> str:
        return self.location.key

    @property
    def uri(self) -> str:
        return self.location.uri()


def eval_relative_path(location: StorageLocation, mltable_dir: StorageLocation) -> str:
    """The file's path in the eval layout:

    - blob / ADLS: `<account>/<container>/<path>`
    - local: `local/<path relative to the MLTable folder>`; a local file
      outside that folder: `local/_abs/<absolute path without its leading '/'>`
      (a separate subtree; a relative `./_abs/...` file that lands on the
      same path is caught by `check_layout`)
    - http(s): `http/<host>/<url path>`
    """
    if location.is_azure:
        return f"{location.account}/{location.container}/{location.path}"
    if location.kind is StorageKind.LOCAL:
        base = (
            (mltable_dir.path.rstrip("/") or "/") if mltable_dir.kind is StorageKind.LOCAL else None
        )
        if base is not None:
            rel = os.path.relpath(location.path, base)
            if not rel.startswith(".." + os.sep) and rel != "..":
                return f"local/{Path(rel).as_posix()}"
        return f"local/_abs/{location.path.lstrip('/')}"
    parts = urlsplit(location.path)
    return f"http/{parts.netloc}/{parts.path.lstrip('/')}"


def eval_mltable_text(table: MLTable, files: list[EvalFile]) -> str:
    """The MLTable file to write at the root of an eval_download / eval_mount
    layout: one `file: ./<eval_path>` entry per evaluated file, and the
    transformations from the read step on (file-level ones are already applied)."""
    first = next((i for i, s in enumerate(table.steps) if s.is_read), len(table.steps))
    leading = [s.raw for s in table.steps[:first] if s.name == PARTITION_STEP]
    rest = [*leading, *(s.raw for s in table.steps[first:])]
    paths = [{"file": f"./{f.eval_path}"} for f in files]
    if not files:
        # No file kept (`take: 0`, a sample that drew none): an MLTable must
        # name a path, so name this MLTable file itself and keep none of it
        # again; loading gives an empty table.
        paths, rest = [{"file": "./MLTable"}], [{"take": 0}, *rest]
    doc: dict[str, object] = {"type": "mltable", "paths": paths}
    if rest:
        doc["transformations"] = rest
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def check_layout(table: MLTable, files: list[EvalFile]) -> None:
    """Every file gets a path of its own under the eval layout root.

    Two files on one eval path (http URLs differing only in their query; a
    local `_abs/...` file beside an absolute one) would show one file twice in
    the layout's MLTable and lose the other; a '.' or '..' segment (an http
    URL) would point the layout's MLTable outside the file's own folder."""
    taken: dict[str, EvalFile] = {}
    for f in files:
        where = f"MLTable {table.source}: {f.entry}"
        if any(part in (".", "..") for part in f.eval_path.split("/")):
            raise DataError(f"{where}: {f.uri}: '.' and '..' segments cannot be in the eval layout")
        other = taken.setdefault(f.eval_path, f)
        if other is not f:
            raise DataError(
                f"{where}: {f.uri} and {other.uri} ({other.entry}) would both be "
                f"{f.eval_path!r} in the eval layout"
            )
