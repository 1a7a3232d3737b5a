"""Read-write filesystem operations (rw_mount) in plain Python: ReadOnlyFS
plus writes, staged locally and uploaded when the writer flushes.

One job: the write side of the FUSE filesystem, testable without a kernel
(tests/test_fs_writable.py drives it over a MemoryStore).

- Files being written live in a staged file (`writeback.Staged`), one per
  path, shared by every handle on it, so every reader sees the written
  bytes. Opening a blob for writing without O_TRUNC first copies it in
  (through the mount's read path); with O_TRUNC, or `create`, it starts empty.
- `flush` (every close(2)), `fsync` and the last `release` upload a dirty
  staged file and return once the blob is committed; a failed upload is EIO
  and the bytes stay staged (journal `failed`). Once every handle is closed
  and the blob is stored, the staged file is dropped.
- Folders and moves are `fs.folders` (marker blobs; rename is copy + delete,
  not atomic; a local output path has real directories). `unlink` deletes.
- A uri_file output (`namespace.file_key`) shows its one name (others: EACCES).
- chmod, chown and utimens are accepted and ignored: blobs have no mode, so
  every file shows the mount's file mode (`fs.access`: by default 0755, so
  a script written to an output runs; folders 0755).
- New names with a backslash are EINVAL, names not valid UTF-8 EILSEQ.
- Every change here invalidates the namespace's caches.

The staged files' table and lifecycle: `fs.staged.StagedFiles`, reached
through ReadOnlyFS's hooks; the filesystem is its own `writes`. Why each
rule: docs/design/rw_mount.md.

Threads: any FUSE thread. `staged.choosing` makes attach-or-stage, renames
and unlinks atomic (a rename's storage calls run under it; the copy of an
existing blob after it); ReadOnlyFS's lock (handle table, counters) is
never held across I/O.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterable, Iterator

from datamount.errors import ObjectNotFound, os_error
from datamount.fs.access import Access, mount_access
from datamount.fs.folders import Folders, folders_for
from datamount.fs.handles import Opened, OpenFile
from datamount.fs.kept import KeptView, is_hidden, keep_readers, open_as, rename_open
from datamount.fs.namespace import Attrs, Namespace, split
from datamount.fs.ops import NAME_MAX, ReadOnlyFS, Writes, findable, is_utf8
from datamount.fs.staged import StagedFiles, StagedView
from datamount.read.reader import Reader, ReadHandle
from datamount.write.journal import Leftovers
from datamount.write.writeback import Staged, WriteBack

_WRITING = os.O_TRUNC | os.O_APPEND
NOT_UTF8 = "name is not valid UTF-8, as Azure blob names must be"


class _OnStaged(OpenFile):
    """A handle on a staged file (opened for writing, or while the path is
    being written): one of the handles `StagedFiles` counts on it."""

    def __init__(self, path: str, staged: Staged, writable: bool) -> None:
        super().__init__(path, StagedView(staged))
        self.staged = staged
        self.writable = writable


class WritableFS(ReadOnlyFS):
    """ReadOnlyFS plus writes; the FUSE adapter mounts it read-write."""

    def __init__(
        self,
        namespace: Namespace,
        reader: Reader,
        writeback: WriteBack,
        *,
        store_id: str,
        access: Access | None = None,
        folders: Folders | None = None,
    ) -> None:
        """`access`: by default the mounting user, files 0755, folders 0755."""
        if access is None:
            access = mount_access(writable=True)
        super().__init__(namespace, reader, store_id=store_id, access=access)
        self.writes: Writes | None = self
        self.store = namespace.store
        self.folders = folders if folders is not None else folders_for(self.store)
        self.writeback = writeback
        self.staged = StagedFiles(namespace, reader, writeback, self.folders, store_id=store_id)
        self.count(writes=0, bytes_written=0, creates=0, mkdirs=0, renames=0, deletes=0)
        self.count(kept_open_files=0)

    # -- names -------------------------------------------------------------------

    @staticmethod
    def _new_name(path: str) -> None:
        """A name this mount may create: not too long, and no backslash (Azure
        reads `\\` as `/`, so `a\\b` would come back as the folder `a`)."""
        name = split(path)[1]
        if not is_utf8(path):
            # bytes: the funnel's log line shows b'/\xff.bin', not a surrogate
            raise OSError(errno.EILSEQ, NOT_UTF8, os.fsencode(path))
        if len(name.encode()) > NAME_MAX:
            raise os_error(errno.ENAMETOOLONG, path)
        if "\\" in name:
            raise os_error(errno.EINVAL, path)

    def _only_the_file(self, path: str) -> None:
        """A uri_file mount holds its one name: no other file or folder."""
        if self.namespace.file_key is not None and path.strip("/") != self.namespace.file_name:
            raise os_error(errno.EACCES, path)

    def lookup(self, path: str) -> Attrs:
        """A path being written shows its staged file (size, time)."""
        findable(path)
        if is_hidden(path):
            return self.attrs_of(open_as(self.open_files(), path))
        staged = self.staged.visible(path.strip("/"))
        if staged is not None:
            return self.staged.attrs(staged)
        return self.namespace.getattr(path)  # (a blob being copied in: its stored size)

    def _find(self, path: str) -> Attrs | None:
        try:
            return self.lookup(path)
        except FileNotFoundError:
            return None

    def _parent_dir(self, path: str) -> None:
        parent = "/" + split(path)[0]
        attrs = self._find(parent)
        if attrs is None:
            raise os_error(errno.ENOENT, parent)
        if not attrs.is_dir:
            raise os_error(errno.ENOTDIR, parent)

    # -- the hooks of ReadOnlyFS ------------------------------------------------------

    def listing(self, path: str) -> Iterable[tuple[str, Attrs]]:
        """The stored entries, each shown as its staged file where there is one,
        then the staged files not stored yet."""
        local = self.staged.in_dir(path.strip("/"))
        overlay = {name: self.staged.attrs(s) for name, s in local.items()}
        listing = self.namespace.list_dir(path)

        def merged() -> Iterator[tuple[str, Attrs]]:
            for name, a in listing:
                yield name, overlay.pop(name, a)
            yield from overlay.items()

        return merged()

    def handle_of(self, file: OpenFile) -> ReadHandle:
        if isinstance(file, _OnStaged) or isinstance(file.handle, KeptView):
            return file.handle
        # opened read-only before a writer staged the path: show the writes
        staged = self.staged.visible(file.path.strip("/"))
        return file.handle if staged is None else StagedView(staged)

    def attrs_of(self, file: OpenFile) -> Attrs:
        if isinstance(file, _OnStaged):
            return self.staged.attrs(file.staged)
        if isinstance(file.handle, KeptView):
            return file.handle.attrs  # its name is gone or names another file now
        return super().attrs_of(file)

    # -- open files whose name goes (POSIX: they keep their bytes) ---------------------

    def getattr(self, path: str) -> dict[str, int]:
        st = super().getattr(path)
        if is_hidden(path):
            st["st_nlink"] = 0  # unlinked, still open
        return st

    def fgetattr(self, fh: int) -> dict[str, int]:
        st = super().fgetattr(fh)
        file = self.opened(fh)
        if file is not None and is_hidden(file.path):
            st["st_nlink"] = 0
        return st

    def _orphaning(self, keys: Callable[[str], bool]) -> None:
        """This mount is about to delete or replace the stored versions of
        `keys`: the handles that read them get local copies (fs.kept)."""
        readers = [f for f in self.open_files() if f.obj is not None and keys(f.obj.key)]
        if readers:
            room = self.writeback.check_space
            self.count(kept_open_files=keep_readers(readers, self.writeback.directory, room))

    def let_go(self, file: OpenFile) -> None:
        if not isinstance(file, _OnStaged):
            super().let_go(file)
            return
        # A failed upload is already logged; the bytes stay staged (journal).
        with contextlib.suppress(OSError):
            self.staged.detach(file.staged, upload=file.writable, why="release")

    def _on_staged(self, fh: int, path: str = "") -> _OnStaged:
        """The handle of `fh` opened for writing; EBADF otherwise."""
        file = self.opened(fh)
        if not isinstance(file, _OnStaged) or not file.writable:
            raise os_error(errno.EBADF, path)
        return file

    # -- space and folders -----------------------------------------------------------

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

    def _is_empty(self, path: str) -> bool:
        if self.staged.any_below(path.strip("/")):
            return False
        return next(iter(self.namespace.list_dir(path)), None) is None

    # -- files -----------------------------------------------------------------------

    def _open_staged(self, path: str, staged: Staged, writable: bool) -> Opened:
        return Opened(self.add_file(_OnStaged(path, staged, writable)), keep_cache=False)

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
                    raise os_error(errno.EISDIR, path)
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
        return self._open_staged(path, staged, writing)

    def create(self, path: str, mode: int = 0o644, flags: int = os.O_WRONLY) -> Opened:
        rel = path.strip("/")
        self._new_name(path)
        self._only_the_file(path)
        self._parent_dir(path)
        with self.staged.choosing:
            staged = self.staged.attach(rel)
            if staged is not None and flags & os.O_EXCL:
                self.staged.unwind(staged)
                raise os_error(errno.EEXIST, path)
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
        self.count(creates=1)
        return self._open_staged(path, staged, True)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        done = self.writeback.write(self._on_staged(fh, path).staged, data, offset)
        self.count(writes=1, bytes_written=done)
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
                    raise os_error(errno.EISDIR, path)
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
        self.writeback.truncate(self._on_staged(fh).staged, length)
        return 0

    def flush(self, fh: int) -> None:
        file = self.opened(fh)
        if isinstance(file, _OnStaged) and file.writable:
            self.writeback.close_dirty(file.staged)
            self.staged.upload(file.staged, "close")

    def fsync(self, fh: int) -> None:
        file = self.opened(fh)
        if isinstance(file, _OnStaged):
            self.staged.upload(file.staged, "fsync")

    # -- names: unlink, mkdir, rmdir, rename -----------------------------------------

    def unlink(self, path: str, *_: object) -> int:
        if is_hidden(path):
            return 0  # libfuse, after the last release of a hidden file: nothing stored
        if self.lookup(path).is_dir:
            raise os_error(errno.EISDIR, path)
        self._remove(path)
        return 0

    def _remove(self, path: str) -> None:
        rel = path.strip("/")
        key = self.staged.key(rel)
        with self.staged.choosing:
            self._orphaning(key.__eq__)
            staged = self.staged.pop(rel)
            if staged is not None:
                self.staged.forget(staged)
            try:
                self.store.delete(key)
            except ObjectNotFound:
                if staged is None:
                    raise os_error(errno.ENOENT, path) from None
            finally:
                self.namespace.invalidate(path)
        self.count(deletes=1)

    def mkdir(self, path: str, mode: int = 0o755) -> int:
        rel = path.strip("/")
        self._new_name(path)
        if self._find(path) is not None:
            raise os_error(errno.EEXIST, path)
        if self.namespace.file_key is not None:
            raise os_error(errno.EACCES, path)
        self._parent_dir(path)
        try:
            self.folders.make(self.staged.key(rel))
        finally:
            self.namespace.invalidate(path)
        self.count(mkdirs=1)
        return 0

    def rmdir(self, path: str, *_: object) -> int:
        rel = path.strip("/")
        if not rel:
            raise os_error(errno.EBUSY, path)
        self.namespace.invalidate_tree(path)  # decide emptiness on a fresh listing
        if not self.lookup(path).is_dir:
            raise os_error(errno.ENOTDIR, path)
        if not self._is_empty(path):
            raise os_error(errno.ENOTEMPTY, path)
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
            raise os_error(errno.EINVAL, old)
        if is_hidden(new) and not self.lookup(old).is_dir:
            self._remove(old)  # libfuse hides an open file: its unlink (fs.kept)
            rename_open(self.open_files(), old, new)
            return 0
        self._new_name(new)
        self._only_the_file(old)
        self._only_the_file(new)
        source = self.lookup(old)
        self._parent_dir(new)
        target = self._find(new)
        if source.is_dir:
            if target is not None:
                if not target.is_dir:
                    raise os_error(errno.ENOTDIR, new)
                if not self._is_empty(new):
                    raise os_error(errno.ENOTEMPTY, new)
                self.rmdir(new)
            self._orphaning(lambda k: k.startswith(self.staged.key(o_rel) + "/"))
            self.staged.rename_dir(o_rel, n_rel)
        else:
            if target is not None and target.is_dir:
                raise os_error(errno.EISDIR, new)
            self._orphaning(self.staged.key(n_rel).__eq__)  # libfuse hid an open target
            self._orphaning(self.staged.key(o_rel).__eq__)
            self.staged.rename_file(o_rel, n_rel)
        self.count(renames=1)
        return 0

    # -- lifecycle ---------------------------------------------------------------------

    def start_recovery(self) -> int:
        """Upload, in the background, what a previous mount left staged;
        returns how many files. They are served from staging meanwhile."""
        return self.staged.start_recovery()

    def finish_writes(self, timeout: float) -> Leftovers:
        """At unmount (this filesystem's `Writes`): what is still only staged
        after the last uploads (`StagedFiles.finish`)."""
        return self.staged.finish(timeout)

    def counters(self) -> dict[str, int]:
        counts = super().counters()
        counts["staged_files"] = len(self.staged.all())
        counts.update(self.writeback.counters())
        return counts

    def close(self) -> None:
        self.staged.close()  # what is not uploaded stays staged, with its journal entry
        super().close()
