"""The supervisor of one background mount: the process `datamount mount`
leaves behind. It starts the mount daemon (mount.serve) as its child with the
plan it was handed, relays the start-up handshake, then waits for it
(waitpid) and starts it again in place when it dies.

`python -m datamount.mount.supervise MOUNTPOINT --ready-fd N` reads its
`MountPlan` (one JSON line) from the start-up channel N, exactly as the
daemon would, and answers on it once its daemon answers. It keeps the line
to hand to every daemon and reads only a few fields of it (`Supervised`):
it lives as long as the mount, so it imports no settings model and no
storage module (its cost: docs/production.md, "A daemon that dies").

- A death is a daemon that ends leaving its mount stale (ENOTCONN: killed by
  a signal or the OOM killer, a crash). The next daemon gets the same plan
  and so the same cache folder (its disk tier indexes the blocks already
  there); it detaches the stale mount lazily just before it mounts
  (mount.daemon), so new opens fail only while it starts. Handles open at the
  death fail with ENOTCONN ("Transport endpoint is not connected") until
  closed: the reader reopens.
- Backoff (`backoff`): the first restart at once, then 1, 2, 4 ... s (at most
  MAX_BACKOFF) before each next, while each new daemon dies within STEADY
  seconds; a death after that restarts at once again. After
  DATAMOUNT_MOUNT_MAX_RESTARTS restarts the next death gives up with one
  ERROR line and the mount stays stale, as it did before supervisors
  (`status` says why). A daemon that fails to start again counts as a death.
- rw_mount is never restarted: its writes in progress die with the daemon, and
  a quiet restart would hide that from the job; its stale mount ends as
  before (`unmount` fails with exit code 4, naming what the journal holds).
- What it records (control.Supervision, `<state>.supervisor.json`): its pid,
  the restarts, the deaths, the last one, why it gave up. `status` shows it;
  each daemon reports its restart count in its stats and metrics.
- A daemon that ends without leaving its mount stale (unmounted by `datamount
  unmount` or from outside, drained after a signal) ends the supervisor too,
  with the daemon's exit code and its record removed.
- SIGTERM/SIGINT/SIGHUP are forwarded to the daemon, which drains and
  unmounts as before; no restart follows.

Threads: none (the signal handlers run on the main thread).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from datamount import __version__
from datamount.errors import EXIT_OK, DataError, DatamountError
from datamount.log import RUNTIME_LOG, setup_logging, shutdown_logging
from datamount.mount import control
from datamount.mount.table import POLL, is_stale

log = logging.getLogger("datamount.supervisor")

MAX_BACKOFF = 30.0  # seconds between two restarts, at most
STEADY = 60.0  # a daemon that served this long died of something else: no backoff


@dataclass(frozen=True)
class Supervised:
    """The fields of a MountPlan's JSON line (mount.plan) the supervisor needs."""

    mountpoint: Path
    mode: str
    label: str  # inputs.NAME / outputs.NAME
    cache_dir: Path
    log_dir: Path
    log_level: str
    max_restarts: int  # DATAMOUNT_MOUNT_MAX_RESTARTS

    @classmethod
    def from_json(cls, line: str) -> Supervised:
        """KeyError, TypeError or ValueError when `line` is no plan."""
        data: dict[str, Any] = json.loads(line)
        settings = data["settings"]
        return cls(
            mountpoint=Path(data["mountpoint"]),
            mode=str(data["mode"]),
            label=f"{data['direction']}s.{data['name']}",
            cache_dir=Path(settings["cache_dir"]),
            log_dir=Path(settings["log_dir"]),
            log_level=str(settings["log_level"]),
            max_restarts=int(settings["mount_max_restarts"]),
        )


def backoff(restart: int) -> float:
    """Seconds to wait before restart number `restart` (1 is the first): 0,
    then 1, 2, 4 ... at most MAX_BACKOFF."""
    return 0.0 if restart <= 1 else min(MAX_BACKOFF, 2.0 ** (restart - 2))


def streak_after(streak: int, served: float) -> int:
    """Restarts in a row so far, after a daemon that served `served` seconds
    died: one that served STEADY seconds or more ends the streak (the next
    restart is immediate again)."""
    return 0 if served >= STEADY else streak


def death(code: int) -> str:
    """How a daemon ended, from its Popen return code."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


class Supervisor:
    """Starts the daemon of `plan`, waits for it, starts it again when it dies."""

    def __init__(self, plan: Supervised, plan_line: str) -> None:
        self.plan = plan
        self.plan_line = plan_line  # sent as is to every daemon
        self.record = control.Supervision(pid=os.getpid())
        self.child: subprocess.Popen[bytes] | None = None
        self.started = 0.0  # time.monotonic() when the child answered
        self.quick = 0  # restarts in a row whose daemon died within STEADY seconds
        self.stop: int | None = None  # the signal that asked us to stop
        state = control.state_file(plan.cache_dir, plan.mountpoint)
        self.record_file = control.supervisor_file(state)

    # -- signals -----------------------------------------------------------------

    def install_signals(self) -> None:
        for sig in control.STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop is None:
            self.stop = signum
        child = self.child
        if child is not None and child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)  # it drains and unmounts, as before

    # -- the daemon ----------------------------------------------------------------

    def _launch(self) -> subprocess.Popen[bytes]:
        plan = self.plan
        argv = [sys.executable, "-m", "datamount.mount.serve", str(plan.mountpoint)]
        proc, _ = control.launch(
            argv, mountpoint=plan.mountpoint, log_file=plan.log_dir / RUNTIME_LOG,
            plan=self.plan_line, new_session=False,
        )  # fmt: skip
        if self.stop is not None:  # asked to stop while it started: it stops too
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, self.stop)
        self.started = time.monotonic()
        return proc

    def _save(self, **changes: object) -> None:
        self.record = dataclasses.replace(self.record, **changes)  # type: ignore[arg-type]
        try:
            control.write_json(self.record_file, asdict(self.record))
        except OSError as exc:
            log.warning("cannot write %s: %s", self.record_file, exc)

    def start(self, readiness: control.Readiness) -> int | None:
        """The first daemon: its answer relayed; None once it serves, else the exit code."""
        self._save()  # a record left by an earlier mount of this point is replaced
        try:
            self.child = self._launch()
        except DatamountError as exc:
            self.record_file.unlink(missing_ok=True)
            readiness.fail(exc)
            return exc.exit_code
        readiness.ok(pid=self.child.pid)
        limit = self.plan.max_restarts
        log.info("supervising the mount daemon of %s (pid %d; at most %d restarts)",
                 self.plan.mountpoint, self.child.pid, limit)  # fmt: skip
        return None

    def serve(self) -> int:
        """Wait for the daemon; start it again while it dies and the budget lasts."""
        while self.child is not None:
            code = self.child.wait()
            self.child = None
            if self.stop is not None or not is_stale(self.plan.mountpoint):
                self.record_file.unlink(missing_ok=True)  # unmounted: nothing to supervise
                return code if code >= 0 else 128 - code
            self._restart(death(code))
        return EXIT_OK

    def _restart(self, why: str) -> None:
        """After a death: a new daemon in self.child, or None when it gave up or
        was told to stop."""
        limit = self.plan.max_restarts
        mp = self.plan.mountpoint
        self.quick = streak_after(self.quick, time.monotonic() - self.started)
        while self.stop is None:
            self._save(deaths=self.record.deaths + 1, last_death=why)
            done = self.record.restarts
            if self.plan.mode == "rw_mount" or done >= limit:
                self._give_up(why)
                return
            self.quick += 1
            delay = backoff(self.quick)
            log.warning("the mount daemon of %s %s; starting it again%s (restart %d of %d)",
                        mp, why, f" in {delay:g} s" if delay else "", done + 1, limit)  # fmt: skip
            if not self._sleep(delay):
                return
            self._save(restarts=done + 1)
            try:
                self.child = self._launch()
            except (DatamountError, OSError) as exc:  # OSError: no process at all
                why = f"failed to start again: {exc}"
                continue
            log.info("%s mounted again (daemon pid %d, restart %d)", mp, self.child.pid, done + 1)
            return

    def _give_up(self, why: str) -> None:
        limit = self.plan.max_restarts
        if self.plan.mode == "rw_mount":
            reason = "an rw_mount is not restarted (its writes in progress are lost)"
        else:
            done = self.record.restarts
            reason = f"gave up after {done} restarts (DATAMOUNT_MOUNT_MAX_RESTARTS={limit})"
        self._save(gave_up=reason)
        log.error("the mount daemon of %s %s; %s: the mount stays stale until "
                  "`datamount unmount` or the next mount clears it", self.plan.mountpoint,
                  why, reason)  # fmt: skip

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless told to stop; False when told."""
        deadline = time.monotonic() + seconds
        while self.stop is None and time.monotonic() < deadline:
            time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
        return self.stop is None


def main(argv: Sequence[str] | None = None) -> int:
    """The background supervisor: plan in, handshake out, supervise; the exit code."""
    parser = argparse.ArgumentParser(prog="datamount-mount-supervisor")
    parser.add_argument("mountpoint", help="the mount point (also for `ps`)")
    parser.add_argument("--ready-fd", type=int, required=True, help="the start-up channel")
    args = parser.parse_args(argv)
    readiness = control.Readiness(args.ready_fd)
    line = control.receive_line(args.ready_fd)
    try:
        plan = Supervised.from_json(line)
    except (ValueError, KeyError, TypeError) as exc:
        readiness.fail(DataError(f"no mount plan on the start-up channel ({exc!r})"))
        return DataError.exit_code
    # No secret is registered for masking: the supervisor never logs the plan,
    # only the daemons' one-line answers, which hold none.
    with contextlib.suppress(OSError):  # the daemon reports an unwritable log folder
        setup_logging(plan.log_dir, level=plan.log_level)
    log.info("datamount %s: mount supervisor for %s (%s)", __version__, plan.mountpoint, plan.label)
    supervisor = Supervisor(plan, line)
    supervisor.install_signals()
    try:
        failed = supervisor.start(readiness)
        return failed if failed is not None else supervisor.serve()
    finally:
        shutdown_logging()


if __name__ == "__main__":  # pragma: no cover  (the spawned supervisor)
    sys.exit(main())
