"""Read-write filesystem operations (rw_mount) in plain Python: ReadOnlyFS
plus writes, staged locally and uploaded when the writer flushes.

One job: the write side of the FUSE filesystem, testable without a kernel
(tests/test_fs_writable.py drives it over a MemoryStore).

- Files being written live in a staged file (`writeback.Staged`), one per
  path, shared by every handle open on that path: reads of a file being
  written, from the same handle or another, see the written bytes. Opening an
  existing blob for writing without O_TRUNC first copies its bytes into the
  staged file (through the mount's read path); with O_TRUNC, or `create`,
  the staged file starts empty.
- `flush` (every close(2)), `fsync` and the last `release` upload a dirty
  staged file (`WriteBack.upload`) and return once the blob is committed; a
  failed upload is EIO to the writer and the bytes stay staged (journal
  `failed`), retried at unmount and by the next mount with the same cache.
  Once every handle is closed and the blob is in storage, the staged file is
  dropped and reads go back to the read-only path (block cache).
- Folders and moves are `fs.folders`: on blob storage, a flat namespace,
  `mkdir` writes a folder marker blob (`dir/`, metadata hdi_isfolder=true:
  durable, and seen as a folder by every other reader — Azure ML, blobfuse2,
  Storage Explorer), `rmdir` deletes it (ENOTEMPTY when anything is below),
  `rename` is copy + delete per blob (a folder: every blob under it) and is
  not atomic; on a local output path a folder is a directory (mkdir, rmdir,
  rename(2)). `unlink` deletes.
- A uri_file output (`namespace.file_key`) shows its one name at the root;
  it can be created, written, truncated and deleted, and no other name (EACCES).
- chmod, chown and utimens are accepted and ignored: blobs have no owner or
  mode, and their time is the service's last-modified time. Files show as
  0755 (a script written to an output can be run), folders 0755.
- New names (create, mkdir, rename's target) with a backslash are EINVAL:
  Azure reads it as `/`, so the name would come back as a folder.
- The namespace's caches are invalidated by every change made here; the
  kernel's own caches follow its dentries.

The table of staged files and their lifecycle is `fs.staged.StagedFiles`.

Threads: any FUSE thread. `_lock` (ReadOnlyFS's) guards the handle tables
and counters and is never held across I/O; `staged.choosing` makes "attach
to the staged file of this path or create it", renames and unlinks atomic
(the copy of an existing blob runs after it is released). Imports `fs.ops`,
`fs.staged`, `fs.namespace`, `writeback`, `reader`, `errors`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from datamount.errors import ObjectNotFound
from datamount.fs.folders import Folders, folders_for
from datamount.fs.namespace import Attrs, Namespace, split
from datamount.fs.ops import NAME_MAX, Opened, ReadOnlyFS, _DirStream, _error
from datamount.fs.staged import StagedFiles
from datamount.read.reader import Reader
from datamount.write.journal import Leftovers
from datamount.write.writeback import Staged, WriteBack

log = logging.getLogger("datamount.fs.writable")

# Blobs have no mode: every file shows executable (blobfuse2 shows 0777), so a
# script a job writes to an output can be run from it; chmod changes nothing.
RW_FILE_MODE = stat.S_IFREG | 0o755
RW_DIR_MODE = stat.S_IFDIR | 0o755
_WRITING = os.O_TRUNC | os.O_APPEND


@dataclass
class _Handle:
    staged: Staged
    writable: bool


class WritableFS(ReadOnlyFS):
    """ReadOnlyFS plus writes; the FUSE adapter mounts it read-write."""

    writable = True

    def __init__(
        self,
        namespace: Namespace,
        reader: Reader,
        writeback: WriteBack,
        *,
        store_id: str,
        uid: int | None = None,
        gid: int | None = None,
        folders: Folders | None = None,
    ) -> None:
        super().__init__(namespace, reader, store_id=store_id, uid=uid, gid=gid)
        self.store = namespace.store
        self.folders = folders if folders is not None else folders_for(self.store)
        self.writeback = writeback
        self.staged = StagedFiles(namespace, reader, writeback, store_id=store_id)
        self._handles: dict[int, _Handle] = {}
        self._recovery: threading.Thread | None = None
        self._counts.update(writes=0, bytes_written=0, creates=0, mkdirs=0, renames=0, deletes=0)

    # -- names -------------------------------------------------------------------

    @staticmethod
    def _new_name(path: str) -> None:
        """A name this mount may create: not too long, and no backslash (Azure
        reads `\\` as `/`, so `a\\b` would come back as the folder `a`)."""
        name = split(path)[1]
        if len(name.encode()) > NAME_MAX:
            raise _error(errno.ENAMETOOLONG, path)
        if "\\" in name:
            raise _error(errno.EINVAL, path)

    def _only_the_file(self, path: str) -> None:
        """A uri_file mount holds its one name: no other file or folder."""
        if self.namespace.file_key is not None and path.strip("/") != self.namespace.file_name:
            raise _error(errno.EACCES, path)

    def _attrs(self, path: str) -> Attrs:
        staged = self.staged.visible(path.strip("/"))
        if staged is not None:
            return self.staged.attrs(staged)
        return self.namespace.getattr(path)  # (a blob being copied in: its stored size)

    def _find(self, path: str) -> Attrs | None:
        try:
            return self._attrs(path)
        except FileNotFoundError:
            return None

    def _parent_dir(self, path: str) -> None:
        parent = "/" + split(path)[0]
        attrs = self._find(parent)
        if attrs is None:
            raise _error(errno.ENOENT, parent)
        if not attrs.is_dir:
            raise _error(errno.ENOTDIR, parent)

    # -- attributes and listings ---------------------------------------------------

    def stat_dict(self, attrs: Attrs) -> dict[str, int]:
        st = super().stat_dict(attrs)
        st["st_mode"] = RW_DIR_MODE if attrs.is_dir else RW_FILE_MODE
        return st

    def getattr(self, path: str) -> dict[str, int]:
        with self._lock:
            self._counts["getattrs"] += 1
        return self.stat_dict(self._attrs(path))

    def fgetattr(self, fh: int) -> dict[str, int]:
        with self._lock:
            handle = self._handles.get(fh)
        if handle is None:
            return super().fgetattr(fh)
        return self.stat_dict(self.staged.attrs(handle.staged))

    def access(self, path: str, mode: int) -> None:
        self._attrs(path)

    def statfs(self) -> dict[str, int]:
        """The staging disk's free space above the reserve: what can be written."""
        st = os.statvfs(self.writeback.directory)
        free = max(0, st.f_bavail * st.f_frsize - self.writeback.options.reserved_free_disk_space)
        return {
            "f_bsize": 4096,
            "f_frsize": 4096,
            "f_blocks": st.f_blocks * st.f_frsize // 4096,
            "f_bfree": free // 4096,
            "f_bavail": free // 4096,
            "f_files": 1 << 20,
            "f_ffree": 1 << 20,
            "f_namemax": NAME_MAX,
        }

    def opendir(self, path: str) -> int:
        attrs = self._attrs(path)
        if not attrs.is_dir:
            raise _error(errno.ENOTDIR, path)
        local = self.staged.in_dir(path.strip("/"))
        overlay = {name: self.staged.attrs(s) for name, s in local.items()}
        listing = self.namespace.list_dir(path)

        def merged() -> Iterator[tuple[str, dict[str, int]]]:
            for name, a in listing:
                yield name, self.stat_dict(overlay.pop(name, a))
            for name, a in overlay.items():
                yield name, self.stat_dict(a)

        with self._lock:
            dh = next(self._ids)
            self._dirs[dh] = _DirStream(merged(), self.stat_dict(attrs))
            self._counts["readdirs"] += 1
        return dh

    def _is_empty(self, path: str) -> bool:
        if self.staged.any_below(path.strip("/")):
            return False
        return next(iter(self.namespace.list_dir(path)), None) is None

    # -- handles ---------------------------------------------------------------------

    def _open_handle(self, staged: Staged, writable: bool) -> Opened:
        with self._lock:
            fh = next(self._ids)
            self._handles[fh] = _Handle(staged, writable)
            self._counts["opens"] += 1
        return Opened(fh, keep_cache=False)

    # -- files -----------------------------------------------------------------------

    def open(self, path: str, flags: int) -> Opened:
        rel = path.strip("/")
        writing = flags & os.O_ACCMODE != os.O_RDONLY or bool(flags & _WRITING)
        truncate = writing and bool(flags & os.O_TRUNC)
        fill: Attrs | None = None
        with self.staged.choosing:
            staged = self.staged.attach(rel)
            if staged is None:
                if not writing:
                    return super().open(path, flags & ~(os.O_CREAT | os.O_EXCL))
                attrs = self.namespace.getattr(path)
                if attrs.is_dir:
                    raise _error(errno.EISDIR, path)
                staged, fill = self.staged.stage(rel, copy=None if truncate else attrs)
                created = True
            else:
                created = False
        if created:
            self.staged.fill(staged, fill)
        else:
            self.staged.wait_ready(staged)
        if truncate:
            try:
                self.writeback.truncate(staged, 0)
            except BaseException:
                self.staged.unwind(staged)
                raise
        return self._open_handle(staged, writing)

    def create(self, path: str, mode: int = 0o644, flags: int = os.O_WRONLY) -> Opened:
        rel = path.strip("/")
        self._new_name(path)
        self._only_the_file(path)
        self._parent_dir(path)
        with self.staged.choosing:
            staged = self.staged.attach(rel)
            if staged is not None and flags & os.O_EXCL:
                self.staged.unwind(staged)
                raise _error(errno.EEXIST, path)
            if staged is None:
                staged, _ = self.staged.stage(rel, copy=None)
        self.staged.wait_ready(staged)
        try:
            if staged.size():
                self.writeback.truncate(staged, 0)
            else:
                self.writeback.mark_dirty(staged)  # an empty new file is uploaded too
        except BaseException:
            self.staged.unwind(staged)
            raise
        with self._lock:
            self._counts["creates"] += 1
        return self._open_handle(staged, True)

    def read(self, fh: int, offset: int, size: int) -> bytes:
        with self._lock:
            handle = self._handles.get(fh)
            file = self._files.get(fh)
        staged = handle.staged if handle is not None else None
        if staged is None and file is not None:
            # opened read-only before a writer staged the path: show the writes
            staged = self.staged.visible(file.path.strip("/"))
        if staged is None:
            return super().read(fh, offset, size)
        data = staged.read(offset, size)
        with self._lock:
            self._counts["reads"] += 1
            self._counts["bytes_read"] += len(data)
        return data

    def read_into(self, fh: int, offset: int, view: memoryview) -> int:
        data = self.read(fh, offset, len(view))  # staged files are read whole-range
        view[: len(data)] = data
        return len(data)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._lock:
            handle = self._handles.get(fh)
        if handle is None or not handle.writable:
            raise _error(errno.EBADF, path)
        done = self.writeback.write(handle.staged, data, offset)
        with self._lock:
            self._counts["writes"] += 1
            self._counts["bytes_written"] += done
        return done

    def truncate(self, path: str, length: int) -> int:
        rel = path.strip("/")
        fill: Attrs | None = None
        with self.staged.choosing:
            staged = self.staged.attach(rel)
            alone = staged is None
            if staged is None:
                attrs = self.namespace.getattr(path)
                if attrs.is_dir:
                    raise _error(errno.EISDIR, path)
                if attrs.size == length:
                    return 0
                staged, fill = self.staged.stage(rel, copy=attrs if length else None)
        if alone:
            self.staged.fill(staged, fill)
        else:
            self.staged.wait_ready(staged)
        try:
            self.writeback.truncate(staged, length)
        finally:
            # truncate(2) on a path no one has open: publish it now.
            self.staged.detach(staged, upload=alone, why="truncate")
        return 0

    def ftruncate(self, fh: int, length: int) -> int:
        with self._lock:
            handle = self._handles.get(fh)
        if handle is None or not handle.writable:
            raise _error(errno.EBADF)
        self.writeback.truncate(handle.staged, length)
        return 0

    def flush(self, fh: int) -> None:
        with self._lock:
            handle = self._handles.get(fh)
        if handle is not None and handle.writable:
            self.writeback.close_dirty(handle.staged)
            self.staged.upload(handle.staged, "close")

    def fsync(self, fh: int) -> None:
        with self._lock:
            handle = self._handles.get(fh)
        if handle is not None:
            self.staged.upload(handle.staged, "fsync")

    def release(self, fh: int) -> None:
        with self._lock:
            handle = self._handles.pop(fh, None)
            self._idle.notify_all()
        if handle is None:
            super().release(fh)
            return
        # A failed upload is already logged; the bytes stay staged (journal).
        with contextlib.suppress(OSError):
            self.staged.detach(handle.staged, upload=handle.writable, why="release")

    # -- names: unlink, mkdir, rmdir, rename -----------------------------------------

    def unlink(self, path: str, *_: object) -> int:
        rel = path.strip("/")
        if self._attrs(path).is_dir:
            raise _error(errno.EISDIR, path)
        with self.staged.choosing:
            staged = self.staged.pop(rel)
            if staged is not None:
                self.staged.forget(staged)
            try:
                self.store.delete(self.staged.key(rel))
            except ObjectNotFound:
                if staged is None:
                    raise _error(errno.ENOENT, path) from None
            finally:
                self.namespace.invalidate(path)
        with self._lock:
            self._counts["deletes"] += 1
        return 0

    def mkdir(self, path: str, mode: int = 0o755) -> int:
        rel = path.strip("/")
        self._new_name(path)
        if self._find(path) is not None:
            raise _error(errno.EEXIST, path)
        if self.namespace.file_key is not None:
            raise _error(errno.EACCES, path)
        self._parent_dir(path)
        try:
            self.folders.make(self.staged.key(rel))
        finally:
            self.namespace.invalidate(path)
        with self._lock:
            self._counts["mkdirs"] += 1
        return 0

    def rmdir(self, path: str, *_: object) -> int:
        rel = path.strip("/")
        if not rel:
            raise _error(errno.EBUSY, path)
        self.namespace.invalidate_tree(path)  # decide emptiness on a fresh listing
        if not self._attrs(path).is_dir:
            raise _error(errno.ENOTDIR, path)
        if not self._is_empty(path):
            raise _error(errno.ENOTEMPTY, path)
        try:
            self.folders.remove(self.staged.key(rel))
        finally:
            self.namespace.invalidate_tree(path)
        return 0

    def rename(self, old: str, new: str, *_: object) -> int:
        o_rel, n_rel = old.strip("/"), new.strip("/")
        if o_rel == n_rel:
            return 0
        if not o_rel or not n_rel or n_rel.startswith(o_rel + "/"):
            raise _error(errno.EINVAL, old)
        self._new_name(new)
        self._only_the_file(old)
        self._only_the_file(new)
        source = self._attrs(old)
        self._parent_dir(new)
        target = self._find(new)
        if source.is_dir:
            if target is not None:
                if not target.is_dir:
                    raise _error(errno.ENOTDIR, new)
                if not self._is_empty(new):
                    raise _error(errno.ENOTEMPTY, new)
                self.rmdir(new)
            self._rename_dir(o_rel, n_rel)
        else:
            if target is not None and target.is_dir:
                raise _error(errno.EISDIR, new)
            self._rename_file(o_rel, n_rel)
        with self._lock:
            self._counts["renames"] += 1
        return 0

    def _rename_file(self, o_rel: str, n_rel: str) -> None:
        old_key, new_key = self.staged.key(o_rel), self.staged.key(n_rel)
        with self.staged.choosing:
            staged = self.staged.pop(o_rel)
            replaced = self.staged.pop(n_rel)
            if replaced is not None:
                self.staged.forget(replaced)
            try:
                if staged is None:
                    self.folders.move_file(old_key, new_key)
                    return
                with staged.lock:  # waits for an upload of it in progress
                    if not staged.dirty:
                        self.folders.move_file(old_key, new_key)
                    else:
                        with contextlib.suppress(ObjectNotFound):  # never uploaded under it
                            self.store.delete(old_key)
                    self.writeback.rekey(staged, new_key)
                self.staged.put(staged)
            finally:
                self.namespace.invalidate("/" + o_rel)
                self.namespace.invalidate("/" + n_rel)
        if staged is not None and staged.handles == 0 and staged.dirty:
            self.staged.upload(staged, "rename")
            self.staged.drop_if_done(staged)

    def _rename_dir(self, o_rel: str, n_rel: str) -> None:
        new_prefix = self.staged.key(n_rel) + "/"
        with self.staged.choosing:
            moved = self.staged.pop_below(o_rel)
            try:
                self.folders.move_folder(self.staged.key(o_rel), self.staged.key(n_rel))
            finally:
                for r, staged in moved:
                    with staged.lock:
                        self.writeback.rekey(staged, new_prefix + r[len(o_rel) + 1 :])
                    self.staged.put(staged)
                self.namespace.invalidate_tree("/" + o_rel)
                self.namespace.invalidate_tree("/" + n_rel)

    # -- metadata that blobs do not have ---------------------------------------------

    def chmod(self, path: str, *_: object) -> int:
        self._attrs(path)  # accepted and ignored: blobs have no mode
        return 0

    chown = utimens = chmod

    def link(self, target: str, source: str) -> int:
        raise _error(errno.EPERM, target)  # no links in a blob namespace

    symlink = link

    def _unsupported(self, path: str, *_: object) -> int:
        raise _error(errno.EOPNOTSUPP, path)  # callers fall back (fallocate) or skip (xattrs)

    mknod = setxattr = removexattr = fallocate = _unsupported

    # -- lifecycle ---------------------------------------------------------------------

    def start_recovery(self) -> int:
        """Upload, in the background, what a previous mount left staged;
        returns how many files. They are served from staging meanwhile."""
        recovered = self.writeback.recover()
        if not recovered:
            return 0
        for staged in recovered:
            self.staged.put(staged)

        def run() -> None:
            for staged in recovered:
                try:
                    self.staged.upload(staged, "recovery")
                except OSError:
                    continue  # logged; stays staged for the unmount retry
                self.staged.drop_if_done(staged)

        self._recovery = threading.Thread(target=run, name="reupload", daemon=True)
        self._recovery.start()
        return len(recovered)

    def _busy(self) -> bool:
        return super()._busy() or bool(self._handles)

    def finish_writes(self, timeout: float) -> Leftovers:
        """At unmount: wait for the re-uploads, retry failed uploads once (all
        within `timeout` s); returns what is still only staged (named in the
        log; the caller exits with EXIT_OUTPUTS). A file still open for
        writing (a forced unmount) is not uploaded: its writer never closed
        it, so it may be incomplete."""
        deadline = time.monotonic() + timeout
        if self._recovery is not None:
            self._recovery.join(max(0.0, deadline - time.monotonic()))
        pending = [s for s in self.staged.all() if s.dirty and s.handles == 0]
        if pending:
            log.info("unmount: %d files to upload before leaving (%.0f s at most)",
                     len(pending), timeout)  # fmt: skip
        for staged in pending:
            if time.monotonic() >= deadline:
                break
            try:
                self.staged.upload(staged, "unmount retry")
            except OSError:
                continue
            self.staged.drop_if_done(staged)
        left = self.writeback.leftovers()
        for key, _ in left.to_upload:
            log.error("not uploaded, kept in staging %s: %s", self.writeback.directory, key)
        for key, path in left.never_closed:
            log.error("still open for writing at unmount, not uploaded (kept in %s): %s",
                      path, key)  # fmt: skip
        return left

    def counters(self) -> dict[str, int]:
        counts = super().counters()
        with self._lock:
            counts["open_files"] += len(self._handles)
        counts["staged_files"] = len(self.staged.all())
        counts.update(self.writeback.counters())
        return counts

    def close(self) -> None:
        with self._lock:
            self._handles.clear()
        self.staged.close()  # what is not uploaded stays staged, with its journal entry
        super().close()
