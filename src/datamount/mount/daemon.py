"""The mount daemon itself (in the spawned mount.serve process, or in
`mount --foreground`): serve a filesystem at a mount point until asked to go,
then drain and unmount.

- `MountDaemon` runs libfuse's loop on a thread (the main thread keeps Python
  signal handlers: libfuse installs its own only where the handler is
  SIG_DFL), writes the stats file every STATS_INTERVAL seconds, and on
  SIGTERM/SIGINT/SIGHUP drains — waits up to DATASET_UNMOUNT_TIMEOUT_SECONDS
  for open files to be closed — then unmounts (`fusermount3 -u`), and if the
  mount is still busy at the deadline, forces it (`fusermount3 -uz` and ends
  the loop).
- A stale mount at the mount point (the daemon it replaces died; the
  supervisor, mount.supervise, started this one) is detached lazily just
  before mounting, so new opens fail only for the time of that start.
- rw_mount: once its loop has ended the daemon waits (the rest of the drain
  time) for pending uploads (`fs.writes.finish_writes`); what is still only
  staged (`write.journal.Leftovers`: closed files to upload, and files never closed,
  which are not uploaded) is named in the log and in `<state>.unsaved.json`,
  and `unmount` then fails with OutputError (exit code 4).

Threads: the caller's (main) thread and libfuse's loop thread with its
workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from datamount.errors import DataError
from datamount.log import activity
from datamount.write.journal import Leftovers

if TYPE_CHECKING:
    from datamount.fs.ops import ReadOnlyFS, Unsaved

from datamount.mount.control import (
    EXIT_WAIT,
    READAHEAD_KB,
    READY_TIMEOUT,
    STATS_INTERVAL,
    STOP_SIGNALS,
    MountState,
    unsaved_file,
    write_json,
)
from datamount.mount.table import POLL, find_mount, fusermount, is_stale, unmount_while_busy

log = logging.getLogger("datamount.daemon")

# glibc gives each thread that contends for malloc an arena of its own (up to 8 per
# core), and each keeps the 2 MiB block buffers freed into it for that thread alone.
# A fixed mmap threshold below the block size would return them too, but every block
# would then pay fresh page faults, so it is not done.
# Why 2 arenas: docs/design/memory.md ("malloc arenas").
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas() -> None:
    """Cap glibc's malloc arenas at MALLOC_ARENAS for this process (call before the
    stack's threads start); MALLOC_ARENA_MAX in the environment wins. A no-op where
    the C library has no mallopt (musl) or refuses."""
    if "MALLOC_ARENA_MAX" in os.environ:
        log.info("malloc arenas: MALLOC_ARENA_MAX=%s from the environment",
                 os.environ["MALLOC_ARENA_MAX"])  # fmt: skip
        return
    try:
        done = ctypes.CDLL(None).mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
    except (OSError, AttributeError):
        done = 0
    if done:
        log.info("malloc arenas: at most %d (freed block buffers are reused by every "
                 "thread; MALLOC_ARENA_MAX overrides)", MALLOC_ARENAS)  # fmt: skip


@dataclass(frozen=True)
class DaemonConfig:
    mountpoint: Path
    fsname: str
    ttl_seconds: float | None  # None: attributes never expire
    drain_timeout: float
    max_threads: int
    state: MountState
    state_file: Path
    stats_file: Path
    stats_interval: float = STATS_INTERVAL


class FuseLoop(Protocol):
    """What the FUSE layer (fs.lowlevel) hands the daemon
    once mounted: a way to end its loop from outside a request."""

    def stop_loop(self, loop_thread: threading.Thread) -> None: ...


class MountDaemon:
    """Serves one mount from the calling (main) thread: `start()` returns once
    the mount answers, `run()` returns once it is gone."""

    def __init__(
        self, fs: ReadOnlyFS, config: DaemonConfig, stats: Callable[[], dict[str, Any]]
    ) -> None:
        self.fs = fs
        self.config = config
        self.stats = stats
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._wake = threading.Event()
        self._signal: int | None = None
        self._error: BaseException | None = None
        self._adapter: FuseLoop | None = None
        self._thread: threading.Thread | None = None
        self._old_handlers: dict[int, Any] = {}
        self.leftovers: Unsaved = Leftovers()  # rw_mount: what is only staged at the end

    @property
    def mountpoint(self) -> Path:
        return self.config.mountpoint

    # -- start ---------------------------------------------------------------

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        try:
            from datamount.fs import lowlevel as fuse_layer
        except (ImportError, OSError) as exc:
            raise DataError(f"FUSE is not available: {exc} (install fuse3)") from None
        self._install_signals()
        self._clear_stale()
        cfg = self.config

        def loop() -> None:
            try:
                fuse_layer.run(
                    self.fs, str(cfg.mountpoint), ttl_seconds=cfg.ttl_seconds,
                    fsname=cfg.fsname, max_threads=cfg.max_threads, on_ready=self._ready.set,
                    adapter_ready=self._set_adapter,
                )  # fmt: skip
            except BaseException as exc:  # reported by start() / run()
                self._error = exc
            finally:
                self._ended.set()
                self._wake.set()

        self._thread = threading.Thread(target=loop, name="fuse-loop", daemon=True)
        self._thread.start()
        try:
            self._wait_answering(timeout)
        except BaseException:
            self._abandon()
            raise
        self._raise_readahead()
        unsaved_file(cfg.state_file).unlink(missing_ok=True)  # a previous daemon's answer
        write_json(cfg.state_file, asdict(cfg.state))
        self._write_stats()
        log.info("mounted %s (%s, pid %d); access: %s", cfg.mountpoint, cfg.fsname, os.getpid(),
                 self.fs.permissions.describe())  # fmt: skip

    def _clear_stale(self) -> None:
        """The mount of a daemon that died (ENOTCONN) is detached to mount again
        in place; handles still open on it keep failing with ENOTCONN."""
        if is_stale(self.mountpoint):
            log.warning("%s: stale mount of a daemon that died; detaching it to mount again",
                        self.mountpoint)  # fmt: skip
            fusermount(self.mountpoint, lazy=True)

    def _set_adapter(self, adapter: FuseLoop) -> None:
        self._adapter = adapter

    def _wait_answering(self, timeout: float) -> None:
        """Until the kernel connected and a stat of the mount point reaches us."""
        deadline = time.monotonic() + timeout
        parent_dev = os.stat(self.mountpoint.parent).st_dev
        while True:
            if self._ended.is_set():
                why = self._error or "libfuse stopped"
                raise DataError(f"mounting {self.mountpoint} failed: {why} (details in the log)")
            if self._signal is not None:
                raise DataError(f"mounting {self.mountpoint} interrupted by signal {self._signal}")
            if self._ready.is_set():
                with contextlib.suppress(OSError):
                    if os.stat(self.mountpoint).st_dev != parent_dev:
                        return
            if time.monotonic() >= deadline:
                raise DataError(f"mounting {self.mountpoint} did not complete in {timeout:.0f} s")
            self._wake.wait(POLL / 2)
            self._wake.clear()

    def _abandon(self) -> None:
        """Start-up failed: leave no mount and no handlers behind (a loop that
        never reached init cannot be stopped: it ends with this process)."""
        if not self._ended.is_set():
            self._force(detach=find_mount(self.mountpoint) is not None)
        self._restore_signals()

    def _raise_readahead(self) -> None:
        entry = find_mount(self.mountpoint)
        if entry is None:
            return
        knob = Path(f"/sys/class/bdi/{entry.device}/read_ahead_kb")
        try:
            knob.write_text(str(READAHEAD_KB))
        except OSError as exc:  # not root, or a read-only /sys: the kernel default stays
            log.info("readahead of %s left as is: %s", self.mountpoint, exc.strerror or exc)

    # -- signals ---------------------------------------------------------------

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # handlers need the main thread; unmount then comes from outside only
        for sig in STOP_SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        # Interrupts libfuse's loop thread in a forced stop (lowlevel's Session.exit).
        self._old_handlers[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda s, f: None)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._signal is None:
            self._signal = signum
        self._wake.set()

    # -- serve -------------------------------------------------------------------

    def run(self) -> None:
        """Serve until unmounted from outside or told to stop by a signal."""
        cfg = self.config
        next_stats = time.monotonic() + cfg.stats_interval
        try:
            while not self._ended.is_set() and self._signal is None:
                self._wake.wait(max(0.0, next_stats - time.monotonic()))
                self._wake.clear()
                if time.monotonic() >= next_stats:
                    self._write_stats()
                    next_stats = time.monotonic() + cfg.stats_interval
            if self._ended.is_set():
                log.info("%s was unmounted from outside the daemon", cfg.mountpoint)
                self._finish_writes(cfg.drain_timeout)
            else:
                name = signal.Signals(self._signal or signal.SIGTERM).name
                with activity("unmount", mountpoint=cfg.mountpoint, reason=name):
                    started = time.monotonic()
                    self.drain_and_unmount(cfg.drain_timeout)
                    self._finish_writes(cfg.drain_timeout - (time.monotonic() - started))
        finally:
            self._finish()

    def _finish_writes(self, timeout: float) -> None:
        """rw_mount: the FUSE loop is over; wait (up to `timeout` s, the rest of
        the drain time) for pending uploads. What is still not uploaded is
        recorded next to the state file for the `unmount` command (exit code 4);
        a daemon killed meanwhile leaves {"pending": true} there."""
        writes = self.fs.writes
        if writes is None:
            return
        answer = unsaved_file(self.config.state_file)
        with contextlib.suppress(OSError):
            write_json(answer, {"pending": True})
        self.leftovers = writes.finish_writes(max(0.0, timeout))
        try:
            if self.leftovers:
                log.error("%s: %s", self.mountpoint,
                          self.leftovers.describe(self.config.state.staging))  # fmt: skip
                staging = {"staging": self.config.state.staging}
                write_json(answer, {"pending": False, **staging, **self.leftovers.to_json()})
            else:
                answer.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot write %s: %s", answer, exc)

    def drain_and_unmount(self, timeout: float) -> None:
        """Wait (up to `timeout` s) for open files to close, unmount; force
        it when the mount is still busy at the deadline."""
        mp = self.mountpoint
        deadline = time.monotonic() + timeout
        if find_mount(mp) is None:
            log.info("%s is already detached; stopping", mp)
            self._force(detach=False)
            return
        if not self.fs.wait_idle(timeout):
            log.warning("%s: files still open after %.0f s", mp, timeout)
        gone, message = unmount_while_busy(mp, deadline)
        if not gone:
            log.warning("%s still busy after %.0f s (%s): forcing the unmount",
                        mp, timeout, message)  # fmt: skip
            self._force()
            return
        if not self._ended.wait(EXIT_WAIT):
            self._force(detach=False)
        log.info("unmounted %s", mp)

    def _force(self, *, detach: bool = True) -> None:
        """Detach the mount now (open files keep it alive in the kernel) and end
        libfuse's loop, which would otherwise serve those files on."""
        if detach:
            fusermount(self.mountpoint, lazy=True)
        if self._adapter is not None and self._thread is not None:
            self._adapter.stop_loop(self._thread)
            self._ended.wait(EXIT_WAIT)

    def _write_stats(self) -> None:
        try:
            write_json(self.config.stats_file, self.stats())
        except OSError as exc:
            log.warning("cannot write %s: %s", self.config.stats_file, exc)

    def _finish(self) -> None:
        cfg = self.config
        self._write_stats()
        log.info("mount stats %s: %s", cfg.mountpoint, json.dumps(self.stats(), sort_keys=True))
        with contextlib.suppress(OSError):
            current = json.loads(cfg.state_file.read_text())
            if current.get("pid") == os.getpid():
                cfg.state_file.unlink()
        self._restore_signals()
        if not self._ended.is_set():
            # libfuse did not let go: leave now rather than hang (the kernel
            # aborts the connection when this process's /dev/fuse fd closes).
            log.error("the FUSE loop of %s did not end; exiting", cfg.mountpoint)
            logging.shutdown()
            os._exit(1)
        self.fs.close()
