"""Where a download's files land: the set of files in flight, and for each
complete one its size check, durability, final name and manifest record.

A file whose bytes are all written is checked against its listed size, made
durable, renamed to its final name and recorded in the resume manifest.
Small files (up to GROUP_COMMIT_MAX_FILE) are made durable in groups of
GROUP_COMMIT_FILES (group commit): one syncfs of the destination covers
every file of the group, whose writes are all done, for about the cost of
one fsync (transfer.durable; where syncfs cannot stand in, each file is
fsync'd), and the group's renames are one manifest write. Until its group
is committed a file keeps its `.part` name. A larger file is fsync'd alone;
with fsync off a file is renamed at once (safe against a process crash, not
against a power loss). No `.part` survives a failed run: complete files are
still committed (a re-run skips them), the others are removed.

Threads: any thread (fetch and writer threads, the lane's collector, the
calling thread). One commit at a time (the others keep downloading); one
lock for the set of files, one for the group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from datamount.transfer.durable import GroupSync
from datamount.transfer.manifest import Manifest
from datamount.transfer.partfile import PartFile
from datamount.transfer.progress import Progress
from datamount.transfer.source import SourceFile

log = logging.getLogger("datamount.transfer.download")

# Files up to this size are made durable in groups of this many (one syncfs),
# once their writes are all done.
GROUP_COMMIT_FILES = 64
GROUP_COMMIT_MAX_FILE = 16 << 20


@dataclass(eq=False)  # identity-hashed: jobs live in a set
class Job:
    """One file in flight."""

    src: SourceFile
    final: Path
    part: PartFile
    pending: int = 0
    dev: int = -1  # st_dev of the .part, once complete
    stale: bool = False
    restarts: int = 0
    written: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Landing:
    def __init__(self, progress: Progress, *, fsync: bool) -> None:
        self.progress = progress
        self.fsync = fsync
        self._jobs: set[Job] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._idle_waiting = False  # wait_idle is waiting: join must wake it
        self._group: list[Job] = []  # complete files waiting for their group commit
        self._group_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._manifest: Manifest | None = None
        self._sync: GroupSync | None = None

    def begin(self, manifest: Manifest, sync: GroupSync) -> None:
        """The manifest and the destination's GroupSync of one copy."""
        self._manifest, self._sync = manifest, sync
        self._idle_waiting = False

    def add(self, job: Job) -> None:
        with self._lock:
            self._jobs.add(job)

    def finish(self, job: Job) -> None:
        """`job`'s bytes are all written: size check, then durable and
        renamed, alone or with its group."""
        job.dev = job.part.check(job.src.size).st_dev
        if not self.fsync or job.src.size > GROUP_COMMIT_MAX_FILE:
            if self.fsync:
                os.fsync(job.part.fd)
            job.part.close()
            self.publish(job)
            return
        self.join(job)

    def join(self, job: Job) -> None:
        """A complete, size-checked file into the group commit."""
        with self._group_lock:
            self._group.append(job)
            full = len(self._group) >= GROUP_COMMIT_FILES
        if full:
            self.commit()
        elif self._idle_waiting:  # set before wait_idle counts the group: no lost wake-up
            with self._lock:
                self._idle.notify_all()  # the last files may all be waiting for a commit

    def commit(self) -> None:
        """Make every file of the current group durable, then rename them all."""
        with self._commit_lock:  # one commit at a time; others keep downloading
            with self._group_lock:
                group, self._group = self._group, []
            if not group:
                return
            assert self._sync is not None and self._manifest is not None
            try:
                self._sync.sync([(job.part.fd, job.dev) for job in group])
            except BaseException:
                for job in group:
                    self.drop(job)
                raise
            renamed: list[Job] = []
            try:
                for job in group:
                    job.part.close()
                    os.replace(job.part.path, job.final)
                    renamed.append(job)
            finally:  # the group's files with their final names: one manifest write
                self._manifest.record_many([(j.src.rel, j.src.size, j.src.etag) for j in renamed])
                for job in renamed:
                    self.progress.file_done()
                    self._forget(job)

    def publish(self, job: Job) -> None:
        """A durable (or fsync-off) file: its final name and its record."""
        assert self._manifest is not None
        os.replace(job.part.path, job.final)
        self._manifest.record(job.src.rel, job.src.size, job.src.etag)
        self.progress.file_done()
        self._forget(job)

    def drop(self, job: Job) -> None:
        """A file that will not land: its `.part` removed."""
        job.part.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(job.part.path)
        self._forget(job)

    def _forget(self, job: Job) -> None:
        with self._lock:
            self._jobs.discard(job)
            if not self._jobs:
                self._idle.notify_all()

    def wait_idle(self, cancel: threading.Event) -> None:
        """Until every file is done or waits only for its group commit; then
        commit the last group. After a failure (`cancel` set) the pools'
        shutdown waits for the tasks, and `cleanup` commits the complete
        files and drops the rest."""
        with self._lock:
            self._idle_waiting = True
            while not cancel.is_set():
                with self._group_lock:
                    grouped = len(self._group)
                if len(self._jobs) <= grouped:
                    break
                self._idle.wait(0.5)
        if not cancel.is_set():
            self.commit()

    def cleanup(self) -> None:
        """After the pools have stopped: files complete and waiting for their
        group commit are committed (a re-run skips them); no .part file
        survives a failed run."""
        try:
            self.commit()
        except OSError as exc:
            log.warning("could not commit the last completed files: %s", exc)
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            self.drop(job)
