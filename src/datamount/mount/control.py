"""The mount lifecycle seen from outside the daemon: state files, mount
point checks, the start-up handshake, unmounting (the kernel's mount table is
mount.table; the daemon itself is mount.daemon).

- `prepare_mountpoint`: a stale mount left by a crashed daemon (ENOTCONN) is
  cleared with `fusermount3 -uz`; a live mount or a non-empty directory is a
  clear error; a missing directory is created.
- `spawn` (the `mount` command without --foreground): starts the mount's
  supervisor (mount.supervise) as a new session with stdio to the runtime
  log, sends it its plan over the start-up channel (a socket pair) and waits
  on the same channel until it reports the mount answers (or its one-line
  error), then checks /proc/self/mountinfo itself. `launch` is the same
  handshake for the supervisor's own child, the daemon. The daemon records
  its pid, spec and mount point in a state file under <cache>/mounts/, the
  supervisor its pid and restarts beside it (`Supervision`,
  `<state>.supervisor.json`). `Readiness` is the child's end of the channel.
- `unmount` (the `unmount` command): retries `fusermount3 -u` until the mount
  is no longer busy or the timeout passes, then forces it (`fusermount3 -uz`)
  and ends the daemon; the daemon sees its loop end, logs its counters and
  exits, and so does its supervisor (no restart: the mount is gone, not
  stale). A stale mount's supervisor (restarting, or backing off) is ended
  first, so it cannot mount again behind the unmount. An rw_mount daemon
  that could not upload everything leaves `<state>.unsaved.json`: `unmount`
  then fails with OutputError (exit 4). A stale rw_mount (its daemon died:
  `MountState.mode`) is cleared, then fails the same way, naming what its
  staging journal (`MountState.staging`) still holds, or that writes in
  progress may be lost.

Threads: none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamount import private
from datamount.errors import DataError, DatamountError, OutputError
from datamount.mount.table import (
    POLL,
    find_mount,
    fusermount,
    is_stale,
    mount_key,
    unmount_while_busy,
)
from datamount.mountinfo import FSTYPE
from datamount.write.journal import Leftovers, died_message

log = logging.getLogger("datamount.mountd")

# The daemon's own environment on top of the one it inherits: it multiplies no
# matrices, yet an eval_mount's daemon loads numpy (mltable.evalmode), whose
# OpenBLAS would start one thread per core that spins at start
# (docs/production.md, "What a mount costs at start").
DAEMON_ENV = {"OPENBLAS_NUM_THREADS": "1"}
READY_TIMEOUT = 60.0  # a mount answers in well under a second; a loaded node may be slow
STATS_INTERVAL = 5.0
EXIT_WAIT = 10.0  # how long a daemon may take to log and exit once unmounted
# Kernel readahead of the mount (its bdi): the kernel keeps up to this much in
# flight in 1 MiB FUSE reads, so a sequential reader gets 4 concurrent requests
# instead of one 128 KiB read at a time (the kernel's default).
READAHEAD_KB = 4096
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Failed(DatamountError):
    """An error reported by the daemon through the readiness pipe."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- processes and the state file ------------------------------------------------


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, exited but not yet reaped, is not alive)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def wait_exit(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL / 2)
    return True


def end_process(pid: int, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        if not alive(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        if wait_exit(pid, wait):
            return


@dataclass(frozen=True)
class MountState:
    """What a running daemon records about itself (<cache>/mounts/<hash>.json)."""

    pid: int
    mountpoint: str
    spec: str
    input: str
    uri: str
    started: float
    stats_file: str
    # Added later; state files written before them read as "" (not rw_mount).
    mode: str = ""  # the entry's mode: "rw_mount" marks a read-write mount
    staging: str = ""  # rw_mount: its staging folder (journal of what is only staged)
    metrics_url: str = ""  # its Prometheus endpoint (DATAMOUNT_METRICS_PORT), "" when off
    hints_socket: str = ""  # where loaders send file hints (data/hints.py), "" when none

    @property
    def writable(self) -> bool:
        return self.mode == "rw_mount"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MountState:
        """Known fields only: a state file of a newer or older version reads too."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def state_file(cache_dir: Path, mountpoint: Path) -> Path:
    digest = hashlib.sha256(mount_key(mountpoint).encode("utf-8", "surrogateescape")).hexdigest()
    return cache_dir / "mounts" / f"{digest[:16]}.json"


def safe_name(name: str) -> str:
    """An entry name made safe for file names and the mount's fsname."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "input"


def stats_path(log_dir: Path, entry: str, mountpoint: Path) -> Path:
    """Where the daemon of `mountpoint` writes its counters: named after the
    entry and a short hash of the mount point, since two mounts may serve
    entries of the same name (every single-shape spec's is `input`)."""
    safe = safe_name(entry)
    digest = hashlib.sha256(mount_key(mountpoint).encode("utf-8", "surrogateescape")).hexdigest()
    return log_dir / f"mount-stats-{safe}-{digest[:8]}.json"


def unsaved_file(state: Path) -> Path:
    """Where an rw_mount daemon leaves what it could not upload, for `unmount`."""
    return state.with_name(state.stem + ".unsaved.json")


@dataclass(frozen=True)
class Supervision:
    """What a mount's supervisor records (<state>.supervisor.json): it outlives
    each daemon's state file, so `status` can say a mount restarted or gave up."""

    pid: int  # the supervisor's
    restarts: int = 0  # daemons started again in place
    deaths: int = 0  # daemons that died leaving the mount stale
    last_death: str = ""  # "killed by SIGKILL", "exited with status 1", ...
    gave_up: str = ""  # why it stopped restarting ("" while it supervises)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Supervision:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def supervisor_file(state: Path) -> Path:
    """Where the supervisor of the daemon with state file `state` records itself."""
    return state.with_name(state.stem + ".supervisor.json")


def read_supervision(cache_dir: Path, mountpoint: Path) -> Supervision | None:
    try:
        data = json.loads(supervisor_file(state_file(cache_dir, mountpoint)).read_text())
        return Supervision.from_dict(data)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def restart_count(cache_dir: Path, mountpoint: Path) -> int:
    """How many times the mount at `mountpoint` was started again (0: never)."""
    record = read_supervision(cache_dir, mountpoint)
    return record.restarts if record is not None else 0


def read_state(cache_dir: Path, mountpoint: Path) -> MountState | None:
    try:
        data = json.loads(state_file(cache_dir, mountpoint).read_text())
        return MountState.from_dict(data)
    except (OSError, ValueError, TypeError):
        return None


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """State and stats files: 0600 in a folder created 0700 (datamount.private)."""
    private.folders(path.parent)
    private.write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


# -- before mounting -------------------------------------------------------------


def prepare_mountpoint(mountpoint: Path, cache_dir: Path, log_dir: Path | None = None) -> None:
    """Make `mountpoint` ready to mount on, or raise DataError saying why not.
    The cache folder the daemon records its state in (and the log folder its
    stdio goes to) are checked first, so a bad --cache-dir or --log-dir
    creates nothing."""
    _make_folder(cache_dir, "cache folder", private.private_root)
    _make_folder(cache_dir / "mounts", "cache folder", private.folders)
    if log_dir is not None:
        _make_folder(log_dir, "log folder", private.folders)
    if is_stale(mountpoint):
        state = read_state(cache_dir, mountpoint)
        log.warning("%s: stale mount (its daemon is gone); clearing it", mountpoint)
        _end_supervisor(_supervisor_pid(cache_dir, mountpoint))
        if state is not None and state.pid != os.getpid():
            end_process(state.pid)
        ok, message = fusermount(mountpoint, lazy=True)
        if not ok or is_stale(mountpoint):
            raise DataError(f"mount point {mountpoint} holds a stale mount that cannot be "
                            f"cleared: {message or 'fusermount3 -uz failed'}")  # fmt: skip
        state_file(cache_dir, mountpoint).unlink(missing_ok=True)
        supervisor_file(state_file(cache_dir, mountpoint)).unlink(missing_ok=True)
    entry = find_mount(mountpoint)
    if entry is not None:
        state = read_state(cache_dir, mountpoint)
        owner = f" by datamount pid {state.pid}" if state and alive(state.pid) else ""
        raise DataError(
            f"mount point {mountpoint} is busy: already mounted ({entry.fstype}{owner}); "
            f"run `datamount unmount {mountpoint}` first"
        )
    if not mountpoint.exists():
        _make_folder(mountpoint, "mount point")
    if not mountpoint.is_dir():
        raise DataError(f"mount point {mountpoint} is not a directory")
    try:
        not_empty = any(os.scandir(mountpoint))
    except OSError as exc:
        raise DataError(f"mount point {mountpoint}: {exc.strerror or exc}") from None
    if not_empty:
        raise DataError(f"mount point {mountpoint} is not empty")


def _mkdir_p(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def _make_folder(path: Path, what: str, make: Callable[[Path], object] = _mkdir_p) -> None:
    """mkdir -p (or `make`), or DataError naming `what`, the folder and the OS reason."""
    try:
        make(path)
    except private.NotPrivate as exc:
        raise DataError(f"{what} {exc}") from None
    except FileExistsError:
        raise DataError(f"{what} {path}: a file of that name is in the way") from None
    except OSError as exc:
        raise DataError(f"cannot create {what} {path}: {exc.strerror or exc}") from None


# -- the parent side of the start-up handshake ------------------------------


def spawn(
    argv: list[str],
    *,
    mountpoint: Path,
    log_file: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = READY_TIMEOUT,
    plan: str | None = None,
) -> int:
    """Start the detached process `argv` (+ `--ready-fd N`, environment `env`)
    as a new session, hand it `plan` and wait until it reports the mount ready
    (`launch`); returns the daemon's pid (the one the answer names, else the
    process's own). Raises the daemon's error otherwise."""
    proc, message = launch(
        argv, mountpoint=mountpoint, log_file=log_file, env=env, timeout=timeout, plan=plan
    )
    proc.returncode = 0  # detached on purpose: the daemon outlives this process
    pid = message.get("pid")
    return pid if isinstance(pid, int) else proc.pid


def launch(
    argv: list[str],
    *,
    mountpoint: Path,
    log_file: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = READY_TIMEOUT,
    plan: str | None = None,
    new_session: bool = True,
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start `argv` (+ `--ready-fd N`), send it `plan` (one line) over the
    start-up channel, wait until it reports the mount ready on the same
    channel; returns the process and its answer. Raises its error otherwise
    (the process is then reaped). The channel is a socket pair: nothing of
    the plan (which holds credentials) is ever on a command line or in an
    environment."""
    _make_folder(log_file.parent, "log folder", private.folders)
    ours, theirs = socket.socketpair()
    with ours:
        try:
            with open(
                private.create(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab"
            ) as out:
                proc = subprocess.Popen(
                    [*argv, "--ready-fd", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=new_session,  # survives the shell and its signals
                    cwd="/",  # holds no directory busy
                    env=dict(env) if env is not None else None,
                )
        finally:
            theirs.close()
        if plan is not None:
            _send_line(ours, plan, timeout)
        line = _read_line(ours.fileno(), timeout)
    message = _answered(proc, line, mountpoint=mountpoint, log_file=log_file, timeout=timeout)
    return proc, message


def _send_line(channel: socket.socket, text: str, timeout: float) -> None:
    """A daemon that dies before reading is reported by its answer (or exit)."""
    channel.settimeout(timeout)
    with contextlib.suppress(OSError):
        channel.sendall(text.encode() + b"\n")
    channel.settimeout(None)


def _answered(
    proc: subprocess.Popen[bytes], line: str, *, mountpoint: Path, log_file: Path, timeout: float
) -> dict[str, Any]:
    log.info("mount daemon pid %d: %s", proc.pid, line or "no answer")
    message = json.loads(line) if line.startswith("{") else {}
    if message.get("ready"):
        entry = find_mount(mountpoint)
        if entry is not None and entry.fstype == FSTYPE:
            return dict(message)
        message = {"error": f"the mount daemon reported ready but {mountpoint} is not mounted"}
    if "error" in message:
        try:
            proc.wait(timeout=EXIT_WAIT)  # it exits by itself after reporting
        except subprocess.TimeoutExpired:
            end_process(proc.pid)
        raise _Failed(str(message["error"]), int(message.get("exit_code", 1)))
    try:
        code: int | None = proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        code = None
    end_process(proc.pid)
    if find_mount(mountpoint) is not None or is_stale(mountpoint):
        fusermount(mountpoint, lazy=True)
    why = f"exited with status {code}" if code is not None else f"gave no answer in {timeout:.0f} s"
    raise DataError(f"the mount daemon {why} before {mountpoint} was ready (details in {log_file})")


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.partition(b"\n")[0].decode("utf-8", "replace")


def receive_line(fd: int, timeout: float = READY_TIMEOUT) -> str:
    """The daemon's side: the one line the parent sends first."""
    return _read_line(fd, timeout)


class Readiness:
    """The daemon's side of the handshake: one JSON line on the inherited fd."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def _send(self, message: dict[str, Any]) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        with contextlib.suppress(OSError):
            os.write(fd, json.dumps(message).encode() + b"\n")
        with contextlib.suppress(OSError):
            os.close(fd)

    def ok(self, **extra: Any) -> None:
        self._send({"ready": True, **extra})

    def fail(self, exc: DatamountError) -> None:
        self._send({"error": str(exc), "exit_code": exc.exit_code})


# -- the unmount command ---------------------------------------------------------


def unmount(mountpoint: Path, *, cache_dir: Path, timeout: float) -> str:
    """Drain and unmount a datamount mount; returns what was done."""
    state = read_state(cache_dir, mountpoint)
    pid = state.pid if state is not None and alive(state.pid) else None
    supervisor = _supervisor_pid(cache_dir, mountpoint)
    if is_stale(mountpoint):
        _end_supervisor(supervisor)  # it would mount again behind us
        fusermount(mountpoint, lazy=True)
        if pid is not None:
            end_process(pid)
        _forget(cache_dir, mountpoint)
        _report_dead_rw(mountpoint, state)
        return "cleared a stale mount"
    entry = find_mount(mountpoint)
    if entry is None:
        _end_supervisor(supervisor)
        _forget(cache_dir, mountpoint)
        if pid is not None:
            end_process(pid)
            return "not mounted; stopped its daemon"
        _report_dead_rw(mountpoint, state)  # a dead daemon's mount detached by someone else
        raise DataError(f"{mountpoint} is not mounted")
    if entry.fstype != FSTYPE:
        raise DataError(f"{mountpoint} is not a datamount mount ({entry.fstype})")
    gone, message = unmount_while_busy(mountpoint, time.monotonic() + timeout)
    how = "unmounted"
    if not gone:
        log.warning("%s: %s; forcing the unmount", mountpoint, message)
        fusermount(mountpoint, lazy=True)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)  # detached: the daemon stops without draining
        how = "forced (still busy)"
    # An rw_mount daemon may spend up to the drain time on pending uploads.
    if pid is not None and not wait_exit(pid, EXIT_WAIT + timeout):
        log.warning("mount daemon %d did not exit; killing it", pid)
        end_process(pid, grace=2.0)
    _end_supervisor(supervisor, wait=EXIT_WAIT)  # it ends with its daemon
    state_file(cache_dir, mountpoint).unlink(missing_ok=True)
    supervisor_file(state_file(cache_dir, mountpoint)).unlink(missing_ok=True)
    _report_unsaved(mountpoint, unsaved_file(state_file(cache_dir, mountpoint)))
    return how


def _supervisor_pid(cache_dir: Path, mountpoint: Path) -> int | None:
    """The pid of the mount's running supervisor, read before unmounting: it
    removes its record as it exits."""
    record = read_supervision(cache_dir, mountpoint)
    if record is None or record.pid == os.getpid() or not alive(record.pid):
        return None
    return record.pid


def _end_supervisor(pid: int | None, wait: float = 0.0) -> None:
    """The supervisor `pid`, if any: given `wait` s to end by itself (its daemon
    gone and the mount not stale, it does), then SIGTERM, SIGKILL."""
    if pid is None:
        return
    if wait > 0 and wait_exit(pid, wait):
        return
    end_process(pid)


def _forget(cache_dir: Path, mountpoint: Path) -> None:
    """The daemon is gone: its state file, its answer and its supervisor's record go too."""
    state = state_file(cache_dir, mountpoint)
    state.unlink(missing_ok=True)
    unsaved_file(state).unlink(missing_ok=True)
    supervisor_file(state).unlink(missing_ok=True)


def _report_dead_rw(mountpoint: Path, state: MountState | None) -> None:
    """After clearing the mount of a dead rw_mount daemon: OutputError (exit
    code 4), since it never finished its uploads. Names what its staging
    journal still holds, or says writes may be lost."""
    if state is not None and state.writable:
        raise OutputError(died_message(str(mountpoint), state.pid, state.staging))


def _report_unsaved(mountpoint: Path, answer: Path) -> None:
    """OutputError (exit code 4) when the rw_mount daemon left writes only staged."""
    try:
        data = json.loads(answer.read_text())
    except (OSError, ValueError):
        return
    answer.unlink(missing_ok=True)
    if not isinstance(data, dict):
        return
    left = Leftovers.from_json(data)
    if left:
        raise OutputError(f"{mountpoint}: {left.describe(str(data.get('staging', '')))}")
    if data.get("pending"):
        raise OutputError(
            f"{mountpoint}: the mount daemon stopped before its uploads finished (kept in the "
            "staging folder; a new mount of this output with the same cache folder uploads them)"
        )
