"""Write-back staging of an rw_mount: local files that hold what is being
written, uploaded whole when the writer flushes, and a journal that survives
the daemon.

One job: own the staging folder of one output (`<cache>/staging/<hash>/`),
created 0700 with every file in it 0600 (datamount.private):

- `create(key)` makes an empty staged file (`<id>.data`), filled through
  `write`/`truncate`; a write that would leave less free disk than
  DATASET_RESERVED_FREE_DISK_SPACE is ENOSPC and changes nothing; a size past
  what an upload can commit (50,000 blocks of BLOCK_SIZE) is EFBIG.
- `upload(staged)` sends the file through the transfer engine's `Uploader`
  (content MD5 always set) under the file's lock, within the UPLOAD area of
  the mount's MemoryBudget, and returns once the blob is committed; a
  failure (after the store's retries) raises EIO and the file stays staged.
- `journal.json` lists every staged file whose bytes are not known to be in
  storage (`open`, `closed`, `failed`), rewritten (tmp + rename) on every
  state change. `recover()` at the next mount with the same cache folder
  hands `closed` and `failed` files back for upload and leaves `open` ones
  as `abandoned`: never published, as their writer never closed them.
- `leftovers()` is what a mount leaves only staged (`journal.Leftovers`), for
  the unmount's message (exit code 4). Why each rule: docs/design/rw_mount.md.

Threads: any FUSE thread. `_lock` guards the journal and counters; each
staged file's `lock` serialises its writes, truncates and uploads (reads are
plain `pread`s and take no lock).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from datamount.budget import UPLOAD, MemoryBudget
from datamount.errors import OutputError, os_error
from datamount.private import folders, write_text
from datamount.storage.base import ObjectStore
from datamount.transfer.progress import Progress
from datamount.transfer.uploader import BLOCK_SIZE, MAX_FILE_SIZE, Uploader, UploadOptions
from datamount.write.journal import (
    ABANDONED,
    CLOSED,
    FAILED,
    JOURNAL,
    OPEN,
    Leftovers,
    classify,
)

log = logging.getLogger("datamount.writeback")

LOCK = ".lock"  # flock'd by the daemon that owns the folder; holds its pid


def _set(event: threading.Event) -> threading.Event:
    event.set()
    return event


@dataclass(eq=False)
class Staged:
    """One staged file. `version` counts changes; the file is dirty while the
    last uploaded version differs. `handles` counts the open FUSE handles."""

    id: str
    key: str
    path: Path
    fd: int
    version: int = 0
    uploaded: int = 0
    handles: int = 0
    discarded: bool = False  # unlinked or replaced: never uploaded again
    closed: bool = False  # its fd is closed (discarded or abandoned)
    state: str | None = None  # journal state; None = not in the journal
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Cleared while the current blob is being copied in; `error` if that failed.
    ready: threading.Event = field(default_factory=lambda: _set(threading.Event()), repr=False)
    error: OSError | None = None

    @property
    def dirty(self) -> bool:
        return self.version != self.uploaded and not self.discarded

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, size, offset)


@dataclass(frozen=True)
class WriteBackOptions:
    block_size: int = BLOCK_SIZE
    threads: int = 8
    reserved_free_disk_space: int = 0


def upload_budget(options: WriteBackOptions) -> int:
    """Bytes of upload buffers a mount needs: one Uploader holds up to
    2 x threads blocks in flight (2 x 8 x 8 MiB = 128 MiB by default)."""
    return 2 * options.threads * options.block_size


class WriteBack:
    """The staging folder of one output and its journal."""

    def __init__(
        self,
        store: ObjectStore,
        directory: Path,
        options: WriteBackOptions,
        budget: MemoryBudget | None = None,
    ) -> None:
        """`budget`: the mount's MemoryBudget, whose UPLOAD area bounds the
        upload buffers; by default one of its own, of upload_budget(options)."""
        if budget is None:
            budget = MemoryBudget({UPLOAD: upload_budget(options)})
        elif (budget.limit(UPLOAD) if budget.has(UPLOAD) else 0) < options.block_size:
            raise ValueError(
                "the memory budget's upload area must hold at least one upload block "
                f"({options.block_size} bytes)"
            )
        self.store = store
        self.directory = directory
        self.options = options
        folders(directory)  # under the cache: 0700, its files 0600 (datamount.private)
        self._lock_fd = self._take_folder(directory)
        self._lock = threading.Lock()
        self._journal: dict[str, dict[str, str]] = self._load()
        # Upload memory, in blocks, shared by every upload of the mount: all
        # of them together hold what one Uploader may (upload_budget).
        self.budget = budget
        self._budget = budget.limit(UPLOAD) // options.block_size
        self._counts = {
            "files_uploaded": 0,
            "bytes_uploaded": 0,
            "upload_failures": 0,
            "uploads_in_flight": 0,
            "reuploads": 0,
        }

    @staticmethod
    def _take_folder(directory: Path) -> int:
        """One daemon per staging folder: two mounts of the same output with the
        same cache would share (and overwrite) one journal."""
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OutputError(
                f"staging folder {directory} is in use by another mount of this output "
                f"(pid {owner}): unmount it first, or use another cache folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def close(self) -> None:
        """Release the staging folder (staged files and journal stay)."""
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1

    # -- the journal -------------------------------------------------------------

    def _load(self) -> dict[str, dict[str, str]]:
        try:
            data = json.loads((self.directory / JOURNAL).read_text())
            entries = data.get("entries", {})
            return {str(k): dict(v) for k, v in entries.items() if isinstance(v, dict)}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, AttributeError) as exc:
            log.error("staging journal %s unreadable (%s): starting a new one",
                      self.directory / JOURNAL, exc)  # fmt: skip
            return {}

    def _save(self) -> None:
        # Called with _lock held. tmp + rename: a crash leaves the old or the new.
        text = json.dumps({"version": 1, "entries": self._journal}, indent=1) + "\n"
        write_text(self.directory / JOURNAL, text)

    def _set_state(self, staged: Staged, state: str | None, error: str = "") -> None:
        with self._lock:
            if state is None:
                if self._journal.pop(staged.id, None) is None:
                    staged.state = None
                    return
            else:
                entry = {"key": staged.key, "state": state}
                if error:
                    entry["error"] = error
                if self._journal.get(staged.id) == entry:
                    return
                self._journal[staged.id] = entry
            staged.state = state
            try:
                self._save()
            except OSError as exc:  # the data is still staged; only crash safety suffers
                log.error("cannot write the staging journal: %s", exc)

    def rekey(self, staged: Staged, key: str) -> None:
        """A rename: the staged file now belongs to blob `key`."""
        staged.key = key
        if staged.state is not None:
            state = staged.state
            staged.state = None
            self._set_state(staged, state)

    # -- staged files --------------------------------------------------------------

    def create(self, key: str) -> Staged:
        sid = uuid.uuid4().hex
        path = self.directory / f"{sid}.data"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        return Staged(sid, key, path, fd)

    def check_space(self, growth: int) -> None:
        """ENOSPC when `growth` more bytes would leave less than the reserve free."""
        if growth <= 0:
            return
        st = os.statvfs(self.directory)
        free = st.f_bavail * st.f_frsize
        if free - growth < self.options.reserved_free_disk_space:
            raise os_error(errno.ENOSPC, f"staging {self.directory}")

    def _changed(self, staged: Staged) -> None:
        staged.version += 1
        if staged.state != OPEN and not staged.discarded:
            self._set_state(staged, OPEN)

    def write(self, staged: Staged, data: bytes, offset: int) -> int:
        if offset + len(data) > MAX_FILE_SIZE:
            raise os_error(errno.EFBIG, staged.key)
        with staged.lock:
            # counted whole: a write inside the size may fill a hole
            self.check_space(len(data))
            done = os.pwrite(staged.fd, data, offset)
            self._changed(staged)
            return done

    def truncate(self, staged: Staged, length: int) -> None:
        """Set the size; growth is a hole, which takes no disk (sparse staging)."""
        if length > MAX_FILE_SIZE:
            raise os_error(errno.EFBIG, staged.key)
        with staged.lock:
            os.ftruncate(staged.fd, length)
            self._changed(staged)

    def fill(self, staged: Staged, size: int, read: object, chunk: int = 8 << 20) -> None:
        """Copy the current blob (`read(offset, n)` -> bytes) into a new staged
        file before it is opened for writing; it stays clean."""
        with staged.lock:
            self.check_space(size)
            offset = 0
            while offset < size:
                data = read(offset, min(chunk, size - offset))  # type: ignore[operator]
                if not data:
                    raise os_error(errno.EIO, f"{staged.key}: ended at {offset} of {size} bytes")
                os.pwrite(staged.fd, data, offset)
                offset += len(data)

    def mark_dirty(self, staged: Staged) -> None:
        """Upload it at the next flush even without a change (a new or renamed file)."""
        with staged.lock:
            self._changed(staged)

    def close_dirty(self, staged: Staged) -> None:
        """Its writer closed it: from now on it is data to publish (journal `closed`)."""
        if staged.dirty and staged.state == OPEN:
            self._set_state(staged, CLOSED)

    def upload(self, staged: Staged, *, why: str = "flush") -> bool:
        """Upload a dirty staged file; True if it uploaded. Raises EIO on failure."""
        with staged.lock:
            if not staged.dirty:
                return False
            version, size = staged.version, staged.size()
            if staged.state == OPEN:
                self._set_state(staged, CLOSED)
            with self._lock:
                self._counts["uploads_in_flight"] += 1
            started = time.monotonic()
            blocks = min(self._budget, max(1, -(-size // self.options.block_size)))
            try:
                options = UploadOptions(
                    threads=self.options.threads, block_size=self.options.block_size, overwrite=True
                )
                with self.budget.held(UPLOAD, blocks * self.options.block_size):
                    uploader = Uploader(self.store, options, Progress("upload"))
                    uploader.upload(staged.path, staged.key)
            except Exception as exc:
                with self._lock:
                    self._counts["uploads_in_flight"] -= 1
                    self._counts["upload_failures"] += 1
                self._set_state(staged, FAILED, str(exc))
                log.error("upload of %s (%d bytes, %s) failed: %s; kept in %s",
                          staged.key, size, why, exc, staged.path)  # fmt: skip
                raise os_error(errno.EIO, staged.key) from exc
            seconds = time.monotonic() - started
            with self._lock:
                self._counts["uploads_in_flight"] -= 1
                self._counts["files_uploaded"] += 1
                self._counts["bytes_uploaded"] += size
                if why == "recovery":
                    self._counts["reuploads"] += 1
            staged.uploaded = version
            self._set_state(staged, None)
            log.info("uploaded %s: %d bytes in %.3f s (%s)", staged.key, size, seconds, why)
            return True

    def forget(self, staged: Staged) -> None:
        """Unlinked or replaced: never uploaded; open handles may still read it."""
        staged.discarded = True
        self._set_state(staged, None)

    def discard(self, staged: Staged) -> None:
        """Remove a staged file: nothing left to upload (or unlinked)."""
        with staged.lock:
            staged.discarded = True
            self._set_state(staged, None)
            if staged.closed:
                return
            staged.closed = True
            with contextlib.suppress(OSError):
                os.close(staged.fd)
            with contextlib.suppress(OSError):
                staged.path.unlink()

    def abandon(self, staged: Staged) -> None:
        """The daemon stops with this file not uploaded: close it, keep it staged."""
        with staged.lock:
            if not staged.closed:
                staged.closed = True
                with contextlib.suppress(OSError):
                    os.close(staged.fd)

    # -- after a restart -------------------------------------------------------------

    def recover(self) -> list[Staged]:
        """Staged files a previous daemon left to upload (closed or failed).
        Files still open when it died stay in the folder and are named."""
        found: list[Staged] = []
        with self._lock:
            entries = dict(self._journal)
        for sid, entry in entries.items():
            path = self.directory / f"{sid}.data"
            key, state = entry.get("key", ""), entry.get("state", "")
            if not path.exists() or not key:
                log.warning("staging journal: %s (%s) has no staged file; dropped", sid, key)
                with self._lock:
                    self._journal.pop(sid, None)
                continue
            if state in (OPEN, ABANDONED):
                log.warning("staged %s (for %s) was still open for writing when a previous "
                            "daemon stopped: not uploaded, kept in place", path, key)  # fmt: skip
                with self._lock:
                    self._journal[sid] = {**entry, "state": ABANDONED}
                continue
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            staged = Staged(sid, key, path, fd, version=1, uploaded=0, state=state)
            log.info("re-uploading %s (%d bytes, left %s by a previous mount)",
                     key, staged.size(), state)  # fmt: skip
            found.append(staged)
        with self._lock, contextlib.suppress(OSError):
            self._save()
        return found

    def leftovers(self) -> Leftovers:
        """What this mount leaves only staged (not the `abandoned` files of an
        earlier one), by kind."""
        with self._lock:
            return classify(self.directory, dict(self._journal))

    def counters(self) -> dict[str, int]:
        with self._lock:
            counts = dict(self._counts)
            counts["uploads_pending"] = sum(
                1 for e in self._journal.values() if e.get("state") != ABANDONED
            )
        return counts
