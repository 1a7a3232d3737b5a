"""The Uploader: copy a local file or folder tree to a store in parallel.

- Small files (≤ block_size) go in one Put Blob; larger ones are staged in
  `block_size` blocks in parallel and committed with one Put Block List.
- Every blob gets its content MD5. A destination blob with the same size and
  MD5 is skipped (one listing of the destination, no per-file request).
- The MD5 is computed before uploading only when a same-size blob exists (to
  decide the skip); otherwise it is computed while the blocks are staged.
- Memory: at most `2 × threads` blocks in flight.
- Names: Azure blob names are UTF-8. A file or folder name that is not valid
  UTF-8 (Linux allows any bytes) stops the upload before any request, with
  one line naming the first such path (bytes shown as `\\xff`): `BadName`,
  exit 2. Nothing is half-uploaded, and nothing is renamed behind the user's back.

Threads: `threads` workers; the calling thread walks the tree and schedules.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from datamount.errors import DatamountError, InvalidInput, ObjectNotFound
from datamount.storage.base import ObjectStore
from datamount.transfer.manifest import MANIFEST_NAME
from datamount.transfer.progress import Progress, human
from datamount.transfer.source import folder_prefix

log = logging.getLogger("datamount.transfer.upload")

# 8 MiB blocks: ≤ 50,000 blocks per blob allows 390 GiB files.
# Why 8 MiB: docs/design/download.md ("Range size").
BLOCK_SIZE = 8 << 20
MAX_BLOCKS = 50_000  # per block blob (Put Block List)
MAX_FILE_SIZE = MAX_BLOCKS * BLOCK_SIZE  # the largest file an upload can commit
HASH_CHUNK = 1 << 20


class BadName(InvalidInput):
    """A local name that cannot be a blob name (not valid UTF-8): refused
    before anything is uploaded (exit 2: bad input, nothing started)."""


@dataclass(frozen=True)
class UploadOptions:
    threads: int = 8
    block_size: int = BLOCK_SIZE
    overwrite: bool = False  # True: upload even when size and MD5 match


@dataclass
class UploadResult:
    files: int
    bytes: int
    skipped_files: int
    skipped_bytes: int
    seconds: float


@dataclass
class _File:
    path: Path
    key: str
    size: int
    md5: bytes | None = None
    pending: int = 0
    md5_future: Future[bytes] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def md5_of(path: Path) -> bytes:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            digest.update(view[:n])  # hashlib drops the GIL for large updates
    return digest.digest()


def block_id(index: int) -> str:
    """Equal-length ids, as Put Block List requires."""
    return base64.b64encode(f"{index:08d}".encode()).decode()


class Uploader:
    def __init__(
        self, store: ObjectStore, options: UploadOptions, progress: Progress | None = None
    ) -> None:
        self.store = store
        self.options = options
        self.progress = progress or Progress("upload")
        self._slots = threading.BoundedSemaphore(options.threads * 2)
        self._cancel = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._inflight = 0
        self._idle = threading.Condition(self._lock)

    def upload(self, src: Path, key: str) -> UploadResult:
        """Upload file `src` to blob `key` (a key ending in '/' gets the file's
        name appended), or every file under folder `src` to prefix `key`."""
        started = time.monotonic()
        if not src.exists():
            raise InvalidInput(f"{src}: no such file or folder to upload")  # exit 2
        if src.is_file():
            key = key + src.name if key.endswith("/") or key == "" else key
            _check_name(src, key)
            files: Iterator[tuple[Path, str]] = iter([(src, key)])
            existing = {} if self.options.overwrite else self._existing_one(key)
        else:
            prefix = folder_prefix(key)
            _check_name(src, prefix)
            _check_tree(src)
            files = ((path, prefix + rel) for path, rel in _walk(src))
            existing = self._existing_tree(prefix)
        log.info(
            "upload %s -> %s: %d threads, %s blocks",
            src,
            key,
            self.options.threads,
            human(self.options.block_size),
        )
        with ThreadPoolExecutor(self.options.threads, thread_name_prefix="upload") as pool:
            self._pool = pool
            try:
                for path, dest_key in files:
                    if self._cancel.is_set():
                        break
                    self._start(path, dest_key, existing.get(dest_key))
            except BaseException as exc:
                self._fail(exc)
            self.progress.listing_done = True
            with self._lock:
                while self._inflight and not self._cancel.is_set():
                    self._idle.wait(0.5)
        if self._error is not None:
            raise self._error
        return UploadResult(
            self.progress.files,
            self.progress.bytes,
            self.progress.skipped_files,
            self.progress.skipped_bytes,
            time.monotonic() - started,
        )

    def _existing_one(self, key: str) -> dict[str, tuple[int, bytes | None]]:
        try:
            info = self.store.stat(key)
        except ObjectNotFound:
            return {}
        return {key: (info.size, info.content_md5)}

    def _existing_tree(self, prefix: str) -> dict[str, tuple[int, bytes | None]]:
        if self.options.overwrite:
            return {}
        return {
            obj.key: (obj.size, obj.content_md5)
            for page in self.store.list_pages(prefix)
            for obj in page.objects
            if not obj.is_dir
        }

    # -- scheduling --------------------------------------------------------

    def _start(self, path: Path, key: str, existing: tuple[int, bytes | None] | None) -> None:
        size = path.stat().st_size
        job = _File(path, key, size)
        self.progress.planned(1, size)
        same_size = existing is not None and existing[0] == size and existing[1] is not None
        with self._lock:
            self._inflight += 1
        if same_size and not self.options.overwrite:
            self._submit(self._check_then_upload, job, existing)
        elif size <= self.options.block_size:
            self._submit(self._put_small, job)
        else:
            self._stage_all(job)

    def _submit(self, fn: object, *args: object, slot: bool = True) -> None:
        if slot:
            self._slots.acquire()

        def run() -> None:
            try:
                if not self._cancel.is_set():
                    fn(*args)  # type: ignore[operator]
            except BaseException as exc:
                self._fail(exc)  # the wait ends on the cancel; no per-file accounting
            finally:
                if slot:
                    self._slots.release()

        self._pool.submit(run)

    def _done(self) -> None:
        with self._lock:
            self._inflight -= 1
            if not self._inflight:
                self._idle.notify_all()

    # -- workers ----------------------------------------------------------

    def _check_then_upload(self, job: _File, existing: tuple[int, bytes | None]) -> None:
        job.md5 = md5_of(job.path)
        if job.md5 == existing[1]:
            self.progress.skipped(1, job.size)
            self._done()
            return
        if job.size <= self.options.block_size:
            self._put_small(job)
        else:
            self._stage_all(job, from_worker=True)

    def _put_small(self, job: _File) -> None:
        data = job.path.read_bytes()
        if len(data) != job.size:
            raise DatamountError(f"{job.path}: changed size while uploading")
        md5 = job.md5 or hashlib.md5(data, usedforsecurity=False).digest()
        self.store.put(job.key, data, content_md5=md5)
        self.progress.add_bytes(job.size)
        self.progress.file_done()
        self._done()

    def _stage_all(self, job: _File, *, from_worker: bool = False) -> None:
        step = self.options.block_size
        blocks = [
            (i, off, min(step, job.size - off)) for i, off in enumerate(range(0, job.size, step))
        ]
        job.pending = len(blocks)
        if job.md5 is None:  # hash alongside the staging; the commit waits for it
            job.md5_future = self._pool.submit(md5_of, job.path)
        for index, offset, length in blocks:
            self._submit(self._stage, job, index, offset, length, slot=not from_worker)

    def _stage(self, job: _File, index: int, offset: int, length: int) -> None:
        with open(job.path, "rb", buffering=0) as f:
            data = os.pread(f.fileno(), length, offset)
        if len(data) != length:
            raise DatamountError(f"{job.path}: changed size while uploading")
        self.store.stage_block(job.key, block_id(index), data)
        self.progress.add_bytes(length)
        with job.lock:
            job.pending -= 1
            last = job.pending == 0
        if last:
            md5 = job.md5 or (job.md5_future.result() if job.md5_future else None)
            ids = [
                block_id(i)
                for i in range((job.size + self.options.block_size - 1) // self.options.block_size)
            ]
            self.store.commit_blocks(job.key, ids, content_md5=md5)
            self.progress.file_done()
            self._done()

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
                log.error("upload failed: %s", exc or type(exc).__name__)
            self._idle.notify_all()
        self._cancel.set()


def shown(path: Path | str) -> str:
    """`path` printable as it is on disk: bytes that are not UTF-8 as `\\xff`
    (Python keeps them as surrogates, which no terminal or log can encode)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_name(src: Path, key: str) -> None:
    """The one destination name of a single-file upload (or the prefix)."""
    if not _utf8(key):
        what = src if not _utf8(src.name) else f"destination {shown(key)}"
        raise BadName(
            f"{shown(what)}: the name is not valid UTF-8, as Azure blob names must be: "
            "rename it and upload again (nothing was uploaded)"
        )


def _check_tree(root: Path) -> None:
    """Every name under `root` can be a blob name, checked before the first
    request (a second walk of the tree: only names, no stat, and the
    dentries are cached for the upload's walk). A bad folder name is named
    once, not for every file below it."""
    bad: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in filenames:
            if not _utf8(name):
                bad.append(base / name)
        keep = [d for d in dirnames if _utf8(d)]
        bad.extend(base / d for d in dirnames if not _utf8(d))
        dirnames[:] = keep
    if bad:
        first = min(bad, key=lambda p: os.fsencode(p))
        more = f" (and {len(bad) - 1} more such names)" if len(bad) > 1 else ""
        raise BadName(
            f"{shown(first)}: the name is not valid UTF-8, as Azure blob names must be{more}: "
            "rename it and upload again (nothing was uploaded)"
        )


def _walk(root: Path) -> Iterator[tuple[Path, str]]:
    """Regular files under `root` (symlinks to files followed), sorted per
    folder. What cannot be a blob is skipped with a warning naming it: dangling
    symlinks, FIFOs, sockets, devices, symlinks to folders (not followed: they
    could loop); empty folders (blob storage has no folders) are counted."""
    empty = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        if not dirnames and not filenames and base != root:
            empty += 1
        for name in dirnames:
            if (base / name).is_symlink():
                log.warning("not uploaded: %s is a symlink to a folder", base / name)
        for name in sorted(filenames):
            path = base / name
            if name == MANIFEST_NAME:
                continue
            if not path.is_file():
                what = "a dangling symlink" if path.is_symlink() else "not a regular file"
                log.warning("not uploaded: %s is %s", path, what)
                continue
            yield path, name if rel_dir == "." else f"{rel_dir}/{name}"
    if empty:
        log.info("%d empty folders not uploaded (blob storage holds files only)", empty)
