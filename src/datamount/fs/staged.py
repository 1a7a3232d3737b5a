"""The staged files of an rw mount, by path: which path is being written,
how many handles hold it, and when it is uploaded and dropped.

One job: the table `path -> writeback.Staged` and its lifecycle, so that
`fs.writable` only decides what each filesystem call means.

- One staged file per path, shared by every handle open on it. `attach`
  joins the one there; `stage` creates it (registered at once), and `fill`
  copies the current blob in afterwards, with no table lock held: later
  openers of that path wait for the copy (`wait_ready`), other paths do not.
- `detach` gives back a handle: the last one (or a writer's, when asked)
  uploads a dirty file; a staged file with no handle and nothing to upload is
  dropped (`drop_if_done`) and reads go back to the read-only path.
- Every upload invalidates the namespace's entry for the path, so the next
  lookup after the drop sees the new version.
- `key` / `rel_of` map paths to blob keys: under the mounted prefix, or for a
  uri_file mount (`namespace.file_key`) the one blob.

Threads: any FUSE thread. `_lock` guards the table and handle counts and is
never held across I/O; `choosing` (taken by the filesystem around "attach or
stage", renames and unlinks) makes those decisions atomic per mount.
Imports `fs.namespace`, `writeback`, `reader`, `blocks`, `errors`.
"""

from __future__ import annotations

import errno
import os
import threading

from datamount.fs.namespace import Attrs, Namespace, split
from datamount.read.blocks import ObjectId
from datamount.read.reader import Reader
from datamount.write.writeback import Staged, WriteBack


def _error(code: int, what: str) -> OSError:
    return OSError(code, os.strerror(code), what)


class StagedFiles:
    def __init__(
        self, namespace: Namespace, reader: Reader, writeback: WriteBack, *, store_id: str
    ) -> None:
        self.namespace = namespace
        self.reader = reader
        self.writeback = writeback
        self.store_id = store_id
        self.choosing = threading.Lock()
        self._lock = threading.Lock()
        self._by_path: dict[str, Staged] = {}  # path relative to the mount -> staged file

    # -- names -------------------------------------------------------------------

    def key(self, rel: str) -> str:
        if self.namespace.file_key is not None:
            return self.namespace.file_key
        return self.namespace.prefix + rel

    def rel_of(self, staged: Staged) -> str:
        if self.namespace.file_key is not None:
            return self.namespace.file_name or ""
        return staged.key[len(self.namespace.prefix) :]

    @staticmethod
    def attrs(staged: Staged) -> Attrs:
        st = os.fstat(staged.fd)
        return Attrs(is_dir=False, size=st.st_size, mtime=st.st_mtime, key=staged.key)

    # -- the table -------------------------------------------------------------------

    def visible(self, rel: str) -> Staged | None:
        """The staged file of `rel` once its content is complete (not while
        the blob is still being copied in: readers see the blob meanwhile)."""
        with self._lock:
            staged = self._by_path.get(rel)
        return staged if staged is not None and staged.ready.is_set() else None

    def in_dir(self, rel: str) -> dict[str, Staged]:
        with self._lock:
            return {
                split(r)[1]: s
                for r, s in self._by_path.items()
                if split(r)[0] == rel and r != rel and s.ready.is_set()
            }

    def any_below(self, rel: str) -> bool:
        with self._lock:
            return any(r.startswith(rel + "/") for r in self._by_path)

    def all(self) -> list[Staged]:
        with self._lock:
            return list(self._by_path.values())

    def pop(self, rel: str) -> Staged | None:
        with self._lock:
            return self._by_path.pop(rel, None)

    def pop_below(self, rel: str) -> list[tuple[str, Staged]]:
        with self._lock:
            moved = [(r, s) for r, s in self._by_path.items() if r.startswith(rel + "/")]
            for r, _ in moved:
                del self._by_path[r]
        return moved

    def put(self, staged: Staged) -> None:
        with self._lock:
            self._by_path[self.rel_of(staged)] = staged

    def _remove(self, staged: Staged) -> None:
        with self._lock:
            rel = self.rel_of(staged)
            if self._by_path.get(rel) is staged:
                del self._by_path[rel]

    # -- handles -----------------------------------------------------------------------

    def attach(self, rel: str) -> Staged | None:
        """One more handle on the staged file of `rel`, if there is one.
        Call with `choosing` held; then `wait_ready` without it."""
        with self._lock:
            staged = self._by_path.get(rel)
            if staged is not None:
                staged.handles += 1
            return staged

    def stage(self, rel: str, *, copy: Attrs | None) -> tuple[Staged, Attrs | None]:
        """A new staged file for `rel`, registered, with one handle. Call with
        `choosing` held; returns the blob version to `fill` in (without it)."""
        staged = self.writeback.create(self.key(rel))
        staged.handles = 1
        fill = copy if copy is not None and copy.size else None
        if fill is not None:
            staged.ready.clear()
        with self._lock:
            self._by_path[rel] = staged
        return staged, fill

    def fill(self, staged: Staged, attrs: Attrs | None) -> None:
        """Copy blob version `attrs` in through the read path. On failure every
        handle waiting for it gets the error and the staged file goes."""
        if attrs is None:
            return
        try:
            obj = ObjectId(self.store_id, attrs.key, attrs.etag, attrs.size)
            handle = self.reader.open(obj)
            try:
                self.writeback.fill(staged, attrs.size, handle.read)
            finally:
                handle.close()
        except Exception as exc:
            staged.error = exc if isinstance(exc, OSError) else _error(errno.EIO, staged.key)
            self._remove(staged)
            staged.ready.set()
            self.unwind(staged)
            raise staged.error from exc
        staged.ready.set()

    def wait_ready(self, staged: Staged) -> None:
        """After `attach`: wait for a copy in progress; its error is ours."""
        staged.ready.wait()
        if staged.error is not None:
            self.unwind(staged)
            raise staged.error

    def unwind(self, staged: Staged) -> None:
        """Give back the handle of an open that failed (no upload)."""
        with self._lock:
            staged.handles -= 1
            last = staged.handles == 0
        if last:
            self.drop_if_done(staged)

    def upload(self, staged: Staged, why: str) -> None:
        try:
            self.writeback.upload(staged, why=why)
        finally:
            # the next lookup (after the staged file is dropped) sees the new etag
            self.namespace.invalidate("/" + self.rel_of(staged))

    def detach(self, staged: Staged, *, upload: bool, why: str) -> None:
        """One handle less; upload when asked or when it was the last one."""
        with self._lock:
            staged.handles -= 1
            last = staged.handles == 0
        try:
            if last:
                self.writeback.close_dirty(staged)
            if (upload or last) and staged.dirty:
                self.upload(staged, why)
        finally:
            if last:
                self.drop_if_done(staged)

    def drop_if_done(self, staged: Staged) -> None:
        """A staged file with no handle and nothing to upload goes away."""
        with self._lock:
            if staged.handles or staged.dirty:
                return
            rel = self.rel_of(staged)
            if self._by_path.get(rel) is staged:
                del self._by_path[rel]
        self.writeback.discard(staged)

    def forget(self, staged: Staged) -> None:
        """Unlinked or replaced: never uploaded; its file goes with the last handle."""
        self.writeback.forget(staged)
        with self._lock:
            idle = staged.handles == 0
        if idle:
            self.writeback.discard(staged)

    def close(self) -> None:
        """The daemon stops: keep what is not uploaded (journal), drop the rest."""
        with self._lock:
            staged, self._by_path = list(self._by_path.values()), {}
        for s in staged:
            if s.dirty:
                self.writeback.abandon(s)
            else:
                self.writeback.discard(s)
        self.writeback.close()
