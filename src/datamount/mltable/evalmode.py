"""The eval modes of an `mltable` input: its MLTable evaluated to files, shown
as one tree.

`evaluate_files` evaluates the MLTable (paths resolved across accounts and
containers, file-level `take`/`skip`/`take_random_sample` applied) to its
files at their eval layout paths — `<account>/<container>/<path>`,
`local/<path relative to the MLTable>`, `http/<host>/<path>` — and the text
of an `MLTable` file for the root that describes the layout (the remaining
transformations, paths rewritten to the local copies). `listing_store`
presents those files, and that MLTable, as one read-only FileListStore;
`evaluated_store` is both. `eval_download` copies that store with the
ordinary Downloader; `eval_mount` evaluates in the `mount` command and its
daemon serves the listing with the ordinary read-only FUSE stack. Each file
is read from its own store with its own credential, pinned to the version
evaluated. Threads: none of its own (the evaluation runs in the caller's).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from datamount.mltable.evaluate import MLTABLE_FILE, StoreFactory, Stores, evaluate_table
from datamount.mltable.layout import EvalFile
from datamount.storage.filelist import FileListStore, ListedFile
from datamount.storage.location import StorageLocation
from datamount.workspace.datastores import Workspace

log = logging.getLogger("datamount.evalmode")


class Listed(Protocol):
    """One evaluated file: where it shows in the layout and where it lives."""

    @property
    def eval_path(self) -> str: ...
    @property
    def location(self) -> StorageLocation: ...
    @property
    def size(self) -> int: ...
    @property
    def etag(self) -> str: ...


def evaluate_files(
    location: StorageLocation,
    workspace: Workspace,
    factory: StoreFactory,
    *,
    base_dir: Path | None = None,
) -> tuple[list[EvalFile], str]:
    """The files of the MLTable at `location` (each pinned to the version
    listed) and the MLTable text of the eval layout's root."""
    _table, files, text = evaluate_table(location, workspace, factory, base_dir=base_dir)
    total = sum(f.size for f in files)
    accounts = sorted({f.eval_path.split("/", 2)[0] for f in files})
    log.info(
        "evaluated MLTable %s: %d files, %d bytes, from %s",
        location.uri(), len(files), total, ", ".join(accounts) or "nothing",
    )  # fmt: skip
    return files, text


def listing_store(files: Sequence[Listed], text: str, factory: StoreFactory) -> FileListStore:
    """Evaluated files as one read-only store (closing it closes the stores
    of every account and container it reads from)."""
    stores = Stores(factory)
    try:
        listed = [
            ListedFile(f.eval_path, stores.get(f.location), f.location.key, f.size, f.etag)
            for f in files
        ]
    except BaseException:
        stores.close()
        raise
    return FileListStore(listed, inline={MLTABLE_FILE: text.encode()}, on_close=stores.close)


def evaluated_store(
    location: StorageLocation,
    workspace: Workspace,
    factory: StoreFactory,
    *,
    base_dir: Path | None = None,
) -> FileListStore:
    """The evaluated MLTable at `location` as one read-only store."""
    files, text = evaluate_files(location, workspace, factory, base_dir=base_dir)
    return listing_store(files, text, factory)
