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
- `start_recovery` uploads, in the background, what a previous mount left
  staged; `finish` (at unmount) waits for it, retries what is still to
  upload, and says what is left only staged (`journal.Leftovers`).
- `rename_file` / `rename_dir`: staged files follow their names (rekeyed,
  with their journal entries); the blobs move through `fs.folders`.
- `key` / `rel_of` map paths to blob keys: under the mounted prefix, or for a
  uri_file mount (`namespace.file_key`) the one blob.

Threads: any FUSE thread, and one "reupload" thread at start. `_lock`
guards the table and handle counts and is never held across I/O; `choosing`
(taken around "attach or stage", renames and unlinks) makes those decisions
atomic per mount (a rename's storage calls run under it); it is taken before
any other lock. Why in fs/, not write/:
docs/design/rw_mount.md ("Threads and locks").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time

from datamount.errors import ObjectNotFound, os_error
from datamount.fs.folders import Folders
from datamount.fs.namespace import Attrs, Namespace, split
from datamount.read.blocks import ObjectId
from datamount.read.reader import Reader
from datamount.write.journal import Leftovers
from datamount.write.writeback import Staged, WriteBack

log = logging.getLogger("datamount.fs.staged")


class StagedView:
    """A staged file as a `ReadHandle`: reads are preads of what is written
    so far (a reader of a file being written sees the writes). Closing it
    closes nothing: the staged file's life is the table's (`detach`)."""

    def __init__(self, staged: Staged) -> None:
        self.staged = staged

    def read(self, offset: int, size: int) -> bytes:
        return self.staged.read(offset, size)

    def read_into(self, offset: int, view: memoryview) -> int:
        return os.preadv(self.staged.fd, [view], offset)

    def close(self) -> None:
        return None


class StagedFiles:
    def __init__(
        self,
        namespace: Namespace,
        reader: Reader,
        writeback: WriteBack,
        folders: Folders,
        *,
        store_id: str,
    ) -> None:
        self.namespace = namespace
        self.reader = reader
        self.writeback = writeback
        self.folders = folders
        self.store_id = store_id
        self.choosing = threading.Lock()
        self._lock = threading.Lock()
        self._by_path: dict[str, Staged] = {}  # path relative to the mount -> staged file
        self._recovery: threading.Thread | None = None

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
            staged.error = exc if isinstance(exc, OSError) else os_error(errno.EIO, staged.key)
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

    # -- renames ----------------------------------------------------------------------

    def rename_file(self, o_rel: str, n_rel: str) -> None:
        """rename(2) of a file: a staged file follows its name (and replaces the
        target's); the blob moves, or, when the staged file has writes not
        uploaded, the old blob is deleted and the staged file uploads under
        the new name."""
        old_key, new_key = self.key(o_rel), self.key(n_rel)
        with self.choosing:
            staged = self.pop(o_rel)
            replaced = self.pop(n_rel)
            if replaced is not None:
                self.forget(replaced)
            try:
                if staged is None:
                    self.folders.move_file(old_key, new_key)
                    return
                with staged.lock:  # waits for an upload of it in progress
                    if not staged.dirty:
                        self.folders.move_file(old_key, new_key)
                    else:
                        with contextlib.suppress(ObjectNotFound):  # never uploaded under it
                            self.namespace.store.delete(old_key)
                    self.writeback.rekey(staged, new_key)
                self.put(staged)
            finally:
                self.namespace.invalidate("/" + o_rel)
                self.namespace.invalidate("/" + n_rel)
        if staged is not None and staged.handles == 0 and staged.dirty:
            self.upload(staged, "rename")
            self.drop_if_done(staged)

    def rename_dir(self, o_rel: str, n_rel: str) -> None:
        """rename(2) of a folder: every blob under it moves, every staged file
        under it follows."""
        new_prefix = self.key(n_rel) + "/"
        with self.choosing:
            moved = self.pop_below(o_rel)
            try:
                self.folders.move_folder(self.key(o_rel), self.key(n_rel))
            finally:
                for r, staged in moved:
                    with staged.lock:
                        self.writeback.rekey(staged, new_prefix + r[len(o_rel) + 1 :])
                    self.put(staged)
                self.namespace.invalidate_tree("/" + o_rel)
                self.namespace.invalidate_tree("/" + n_rel)

    # -- a mount's start and end --------------------------------------------------------

    def start_recovery(self) -> int:
        """Upload, in the background, what a previous mount left staged;
        returns how many files. They are served from staging meanwhile."""
        recovered = self.writeback.recover()
        if not recovered:
            return 0
        for staged in recovered:
            self.put(staged)

        def run() -> None:
            for staged in recovered:
                try:
                    self.upload(staged, "recovery")
                except OSError:
                    continue  # logged; stays staged for the unmount retry
                self.drop_if_done(staged)

        self._recovery = threading.Thread(target=run, name="reupload", daemon=True)
        self._recovery.start()
        return len(recovered)

    def finish(self, timeout: float) -> Leftovers:
        """At unmount: wait for the re-uploads, retry failed uploads once (all
        within `timeout` s); returns what is still only staged (named in the
        log; the caller exits with EXIT_OUTPUTS). A file still open for
        writing (a forced unmount) is not uploaded: its writer never closed
        it, so it may be incomplete."""
        deadline = time.monotonic() + timeout
        if self._recovery is not None:
            self._recovery.join(max(0.0, deadline - time.monotonic()))
        pending = [s for s in self.all() if s.dirty and s.handles == 0]
        if pending:
            log.info("unmount: %d files to upload before leaving (%.0f s at most)",
                     len(pending), timeout)  # fmt: skip
        for staged in pending:
            if time.monotonic() >= deadline:
                break
            try:
                self.upload(staged, "unmount retry")
            except OSError:
                continue
            self.drop_if_done(staged)
        left = self.writeback.leftovers()
        for key, _ in left.to_upload:
            log.error("not uploaded, kept in staging %s: %s", self.writeback.directory, key)
        for key, path in left.never_closed:
            log.error("still open for writing at unmount, not uploaded (kept in %s): %s",
                      path, key)  # fmt: skip
        return left

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
