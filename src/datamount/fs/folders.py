"""What a folder is in the store under an rw_mount, and how names move.

One job: the few operations where a flat blob namespace and a local
directory tree differ, so that `fs.writable` decides what each filesystem
call means without knowing which one it writes to.

- `MarkerFolders` (blob storage): `make` writes a folder marker blob (`dir/`,
  metadata hdi_isfolder=true, as ADLS and blobfuse2 mark folders: durable,
  and seen as a folder by every other reader); `remove` deletes it (a folder
  with no marker has nothing stored); `move_file` is a server-side copy then
  a delete; `move_folder` does that for every blob under the prefix, in
  parallel, and is not atomic.
- `LocalFolders` (a local output path): a directory is a directory. `make`
  is mkdir (creating the output's own folder when it does not exist yet),
  `remove` is rmdir, and both moves are one rename(2): atomic, and empty
  subfolders move too.

`folders_for(store)` picks one by the store's declared `local_path`.
Threads: any FUSE thread; no state.
"""

from __future__ import annotations

import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from datamount.errors import ObjectNotFound
from datamount.storage.base import ObjectStore

log = logging.getLogger("datamount.fs.folders")

FOLDER_METADATA = {"hdi_isfolder": "true"}  # what ADLS and blobfuse2 mark folders with
RENAME_THREADS = 8  # copy + delete of a folder's blobs in parallel


class Folders(Protocol):
    """Keys are store keys without a trailing '/'."""

    def make(self, key: str) -> None: ...

    def remove(self, key: str) -> None: ...

    def move_file(self, old_key: str, new_key: str) -> None: ...

    def move_folder(self, old_key: str, new_key: str) -> None: ...


class MarkerFolders:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def make(self, key: str) -> None:
        self.store.put(key + "/", b"", metadata=FOLDER_METADATA)

    def remove(self, key: str) -> None:
        with contextlib.suppress(ObjectNotFound):  # no marker (its last blob went)
            self.store.delete(key + "/")

    def move_file(self, old_key: str, new_key: str) -> None:
        self.store.copy(old_key, new_key)
        self.store.delete(old_key)

    def move_folder(self, old_key: str, new_key: str) -> None:
        old_prefix, new_prefix = old_key + "/", new_key + "/"
        keys = [obj.key for page in self.store.list_pages(old_prefix) for obj in page.objects]

        def move(key: str) -> None:
            self.move_file(key, new_prefix + key[len(old_prefix) :])

        with ThreadPoolExecutor(RENAME_THREADS, thread_name_prefix="rename") as pool:
            list(pool.map(move, keys))
        log.info("renamed folder %s -> %s: %d blobs copied and deleted",
                 old_prefix, new_prefix, len(keys))  # fmt: skip


class LocalFolders:
    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key.lstrip("/"))

    def make(self, key: str) -> None:
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)  # the output's folder may not exist yet
        os.mkdir(path)

    def remove(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(self._path(key))

    def move_file(self, old_key: str, new_key: str) -> None:
        new = self._path(new_key)
        os.makedirs(os.path.dirname(new), exist_ok=True)
        try:
            os.rename(self._path(old_key), new)
        except FileNotFoundError as exc:
            raise ObjectNotFound(f"rename {old_key!r}: {exc.strerror}") from None

    move_folder = move_file


def folders_for(store: ObjectStore) -> Folders:
    """Real directories where the store's objects are local files (its
    declared `local_path`), marker blobs everywhere else."""
    root = store.local_path("")
    if root is not None:
        return LocalFolders(root)
    return MarkerFolders(store)
