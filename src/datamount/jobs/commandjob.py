"""`datamount run JOB.yaml`: one Azure ML command job, start to end, on this node.

What the service does around a command job: validate everything first
(nothing starts on a bad spec), materialise every input by its mode and every
output (in parallel: each entry is independent), substitute `${{inputs.x}}` /
`${{outputs.y}}` in the command, run it with `bash -c` in `code` with the
job's `environment_variables`, then upload outputs, register assets, unmount
and clean up. The exit code is the command's own; a job whose data could not
be prepared exits EXIT_DATA (the command never starts) and one whose outputs
could not be written exits EXIT_OUTPUTS.

Every entry is prepared and finished through the mode table (modes), as the
`mount` and `unmount` commands do. Printing goes through the `say` callable
the CLI passes. Threads: one per entry while preparing; the command itself
runs in a child process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from datamount import modes
from datamount.errors import (
    EXIT_DATA,
    EXIT_OK,
    EXIT_OUTPUTS,
    DataError,
    DatamountError,
    InvalidInput,
    SpecError,
)
from datamount.jobs import environment
from datamount.jobs.environment import substitute
from datamount.jobspec.job import DataInput, JobSpec, LiteralInput, Mode
from datamount.log import activity
from datamount.modes import upload_records
from datamount.modes.context import Context, all_entries
from datamount.modes.upload import register_output
from datamount.mount import table
from datamount.workspace.catalog import kind_of

log = logging.getLogger("datamount.run")

# Attempts to prepare one input when its failure is transient (each attempt
# already retried every request AZUREML_DATASET_HTTP_RETRY_COUNT times).
PREPARE_ATTEMPTS = 3
PREPARE_BACKOFF = 2.0  # seconds before the 2nd attempt, doubled after
LEFTOVER_GRACE = 5.0  # seconds the command's leftover processes get after SIGTERM
# A command killed by SIGKILL (the OOM killer's signal) may succeed when run again.
KILLED = 128 + signal.SIGKILL
RESTART_BACKOFF = 1.0  # seconds before the first restart, doubled after, at most
RESTART_BACKOFF_MAX = 30.0


@dataclass
class Prepared:
    """One materialised entry: what `${{...}}` becomes, and what to undo."""

    entry: DataInput
    value: str  # the path (or URI for direct) substituted in the command
    mountpoint: Path | None = None  # a FUSE mount or an upload folder to finish


def check(ctx: Context, spec: JobSpec) -> None:
    """Everything that can be known before starting, all problems at once."""
    problems: list[str] = []
    if spec.shape != "command" or not spec.command:
        raise SpecError(f"{spec.source}: `run` needs an Azure ML command job (with 'command:')")
    workspace = ctx.load_workspace(required=False)
    for entry in all_entries(spec):
        where = f"{entry.direction}s.{entry.name}"
        allowed = modes.modes_for(entry.direction)
        if entry.mode not in allowed:
            problems.append(
                f"{where}.mode: {entry.mode.value} is not available in `run` "
                f"(supported: {', '.join(m.value for m in allowed)})"
            )
        try:
            ctx.resolve(spec, entry)
        except InvalidInput as exc:
            problems += exc.problems
        if entry.asset_name is not None and workspace is None:
            problems.append(
                f"{where}: registering data asset {entry.asset_name!r} needs a workspace file "
                f"({ctx.workspace_path()} not found)"
            )
        elif entry.asset_name and entry.asset_version and workspace is not None:
            kind = kind_of(entry.type.value)
            known = workspace.versions(entry.asset_name, kind)
            if any(v.version == entry.asset_version for v in known):
                problems.append(
                    f"{where}: {'model' if kind == 'model' else 'data asset'} "
                    f"{entry.asset_name}:{entry.asset_version} is already registered"
                )
    pinned = [f"{o.asset_name}:{o.asset_version}" for o in spec.outputs.values() if o.asset_version]
    for asset in sorted({a for a in pinned if pinned.count(a) > 1}):
        problems.append(f"outputs: two outputs register data asset {asset}")
    try:  # every reference outside $[[...]] has a value (placeholders for data)
        placeholders = {f"{e.direction}s.{e.name}": "x" for e in all_entries(spec)}
        literals = {
            f"inputs.{k}": "x"
            for k, v in spec.inputs.items()
            if isinstance(v, LiteralInput) and v.value is not None
        }
        substitute(spec.command, {**placeholders, **literals})
    except SpecError as exc:
        problems += exc.problems
    code = code_dir(spec)
    if code is not None and not code.is_dir():
        problems.append(f"code: {code} is not a folder")
    if problems:
        raise SpecError(problems)


def run_name(job_name: str) -> str:
    """A unique name for one run of a job, as Azure ML gives every job: the
    job's name made path-safe, the time, and a random suffix. Default output
    paths use it, so two runs never write over each other's outputs."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", job_name).strip("._-")[:40] or "job"
    return f"{safe}_{time.strftime('%Y%m%d_%H%M%S')}_{secrets.token_hex(3)}"


def code_dir(spec: JobSpec) -> Path | None:
    if spec.code is None:
        return None
    base = spec.source.parent if spec.source else Path.cwd()
    return (base / os.path.expanduser(spec.code)).resolve()


class JobRun:
    """One run of one job in `workdir` (created by the caller)."""

    def __init__(
        self,
        ctx: Context,
        spec: JobSpec,
        workdir: Path,
        *,
        say: Callable[[str], None],
    ) -> None:
        self.ctx = ctx
        self.spec = spec
        self.workdir = workdir
        self.say = say
        self.prepared: list[Prepared] = []
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._finishing = False
        self._signalled = False  # a signal reached the command: it is not run again

    # -- the whole run -----------------------------------------------------------

    def run(self) -> int:
        """The whole run; returns its exit code (the command's own, or
        EXIT_DATA / EXIT_OUTPUTS). A run whose command started is recorded
        in the run history (environment.record_run)."""
        code = self._run()
        if self._child is not None:
            try:
                environment.record_run(self.ctx, self.spec, code)
            except DatamountError as exc:
                self.say(f"the run history could not be written: {exc}")
        return code

    def _run(self) -> int:
        with activity("run", job=self.spec.name, workdir=self.workdir), self._signals():
            try:
                self._prepare_all()
            except DatamountError as exc:
                self._undo()
                self.say(f"data could not be prepared: {exc}")
                return EXIT_DATA
            except BaseException:  # interrupted: nothing prepared may outlive the run
                self._undo()
                raise
            try:
                code = self._runs()
            finally:
                # From here on a signal no longer interrupts: the job's outputs
                # are written and its mounts undone first (each bounded by its
                # unmount timeout), whatever arrives meanwhile.
                self._finishing = True
                try:
                    problems = self._finish(command_ok=self._child_ok())
                finally:
                    self._undo(inputs_only=True)
            if problems:
                for line in problems:
                    self.say(f"outputs could not be written: {line}")
                return code if code != EXIT_OK else EXIT_OUTPUTS
            return code

    def _runs(self) -> int:
        """The command's attempts (_attempts) and, while they end for a
        transient reason with the restarts spent and DATAMOUNT_RUN_MAX_RETRIES
        lasts, the whole job run again: its inputs unmounted and prepared anew
        (their caches stay warm), its outputs in place. Returns the last
        attempt's exit code, or EXIT_DATA when the inputs cannot be prepared
        again."""
        settings = self.ctx.settings
        runs, first = 1 + settings.run_max_retries, 1
        transient = {KILLED, *settings.run_restart_exit_codes}
        for run in range(1, runs + 1):
            values = self._values()
            command = substitute(self.spec.command or "", values)
            code, first = self._attempts(command, values, first)
            if code not in transient or self._signalled or run == runs:
                break
            self.say(
                f"job run {run} of {runs}: the command {_exit_reason(code)} with its restarts "
                "spent; preparing the inputs again (outputs stay in place)"
            )
            log.warning("job run %d of %d ended transient (%d); retrying the job", run, runs, code)
            self._undo(inputs_only=True)
            self.prepared = [p for p in self.prepared if p.entry.direction == "output"]
            try:
                self._prepare_all(inputs_only=True)
            except DatamountError as exc:
                self.say(f"data could not be prepared: {exc}")
                return EXIT_DATA
        if runs > 1 and run > 1:
            self.say(f"the job ran {run} times of {runs}; the last attempt {_exit_reason(code)}")
        return code

    def _attempts(self, command: str, values: dict[str, str], first: int = 1) -> tuple[int, int]:
        """The command, run again while it ends for a transient reason and the
        restart budget lasts (DATAMOUNT_RUN_MAX_RESTARTS): inputs stay mounted
        with their caches, outputs (checkpoints) stay in place. Attempts are
        numbered from `first`. Returns the last attempt's exit code and the
        number of the next attempt."""
        settings = self.ctx.settings
        attempts = 1 + settings.run_max_restarts
        transient = {KILLED, *settings.run_restart_exit_codes}
        attempt, delay = 1, RESTART_BACKOFF
        while True:
            code = self._execute(command, values, first + attempt - 1)
            again = code in transient and not self._signalled and attempt < attempts
            if not again:
                break
            reason = _exit_reason(code)
            log.warning(
                "attempt %d of %d: %s; restarting in %.0f s", attempt, attempts, reason, delay
            )
            self.say(
                f"attempt {attempt} of {attempts}: {reason}; restarting in {delay:.0f} s "
                "(inputs stay mounted, outputs in place)"
            )
            self._finishing = False  # a signal during the wait ends the run
            time.sleep(delay)
            attempt, delay = attempt + 1, min(delay * 2, RESTART_BACKOFF_MAX)
        if attempts > 1 and (attempt > 1 or code != EXIT_OK):
            why = "transient" if code in transient else "not transient"
            spent = attempt == attempts and code in transient and code != EXIT_OK
            self.say(
                f"the command ran {attempt} attempt{'s' if attempt > 1 else ''} of "
                f"{attempts}; the last {_exit_reason(code)}"
                + ("" if code == EXIT_OK else f" ({why}{', restarts spent' if spent else ''})")
            )
        return code, first + attempt

    def _child_ok(self) -> bool:
        return self._child is not None and self._child.returncode == 0

    # -- materialising -------------------------------------------------------------

    def _prepare_all(self, *, inputs_only: bool = False) -> None:
        entries = list(self.spec.data_inputs.values())
        if not inputs_only:
            entries += list(self.spec.outputs.values())
        if not entries:
            return
        # Each entry records itself once ready, so an interrupt (which still
        # waits for the entries in progress) leaves nothing unrecorded to undo.
        with ThreadPoolExecutor(len(entries), thread_name_prefix="prepare") as pool:
            futures = [pool.submit(self._prepare_retrying, entry) for entry in entries]
            errors: list[str] = []
            for entry, future in zip(entries, futures, strict=True):
                try:
                    future.result()
                except DatamountError as exc:
                    where = f"{entry.direction}s.{entry.name}"
                    errors.append(str(exc) if str(exc).startswith(where) else f"{where}: {exc}")
        if errors:
            raise DataError("; ".join(errors))

    def _prepare_retrying(self, entry: DataInput) -> Prepared:
        delay = PREPARE_BACKOFF
        for attempt in range(1, PREPARE_ATTEMPTS + 1):
            try:
                return self._prepare(entry)
            except DataError as exc:
                if not exc.transient or attempt == PREPARE_ATTEMPTS:
                    raise
                log.warning(
                    "%ss.%s: transient failure (%s); attempt %d of %d in %.1f s",
                    entry.direction, entry.name, exc, attempt + 1, PREPARE_ATTEMPTS, delay,
                )  # fmt: skip
                time.sleep(delay * random.uniform(0.5, 1.0))
                delay *= 2
        raise AssertionError("unreachable")

    def _prepare(self, entry: DataInput) -> Prepared:
        folder = self.workdir / f"{entry.direction}s" / entry.name
        where = f"{entry.direction}s.{entry.name}"
        started = time.monotonic()
        if entry.mode in (Mode.DOWNLOAD, Mode.EVAL_DOWNLOAD):
            folder.mkdir(parents=True, exist_ok=True)
        path = modes.prepare(self.ctx, self.spec, entry, folder)
        keep = folder if modes.handler(entry.mode).keeps_folder else None
        prepared = Prepared(entry, str(path), keep)
        with self._lock:
            self.prepared.append(prepared)
        self.say(f"{where} ({entry.mode.value}): {path} [{time.monotonic() - started:.1f} s]")
        return prepared

    def _values(self) -> dict[str, str]:
        values = {f"{p.entry.direction}s.{p.entry.name}": p.value for p in self.prepared}
        for name, item in self.spec.inputs.items():
            if isinstance(item, LiteralInput) and item.value is not None:
                values[f"inputs.{name}"] = item.render()
        return values

    # -- the command -----------------------------------------------------------

    def _execute(self, command: str, values: dict[str, str], attempt: int = 1) -> int:
        cwd = code_dir(self.spec) or self.workdir
        log.info("running the command in %s (attempt %d)", cwd, attempt)
        self.say(f"running the command in {cwd}" + (f" (attempt {attempt})" if attempt > 1 else ""))
        env = environment.command_env(self.ctx.environ, values, self.ctx.run_name or "")
        env[environment.ATTEMPT] = str(attempt)
        with activity("command", job=self.spec.name):
            # Its own process group: signals reach the whole command, and what it
            # leaves running in the background ends with it (as when Azure ML
            # tears a job's container down), not holding the mounts busy.
            self._child = subprocess.Popen(
                ["bash", "-c", command], cwd=cwd, env=env, start_new_session=True,
            )  # fmt: skip
            code = self._child.wait()
            self._finishing = True  # from here on, outputs first (see run())
            self._end_group(self._child.pid)
        if code < 0:
            code = 128 - code  # killed by a signal: the shell's convention
        log.info("the command exited with %d", code)
        self.say(f"the command exited with {code}")
        return code

    @staticmethod
    def _end_group(pgid: int) -> None:
        """End what the command left running: SIGTERM, then SIGKILL after
        LEFTOVER_GRACE seconds for what ignores it."""
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return  # nothing left
        log.info("the command left processes running; sent them SIGTERM")
        deadline = time.monotonic() + LEFTOVER_GRACE
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
            log.warning("the command's leftover processes ignored SIGTERM; killed them")

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """For the whole run: SIGTERM/SIGINT/SIGHUP go to the command's process
        group while it runs (it decides what to do; outputs are written after
        it exits); at any other time they interrupt the run, which undoes what
        it prepared."""

        def handle(signum: int, frame: FrameType | None) -> None:
            if self._child is not None and self._child.poll() is None:
                self._signalled = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self._child.pid, signum)
                return
            if self._finishing:
                # Logged, not printed: a handler must not write to a stream the
                # interrupted code may be writing to.
                log.warning("signal %d while writing outputs: finishing them first", signum)
                return
            log.warning("run interrupted by signal %d", signum)
            raise KeyboardInterrupt

        with environment.handling((signal.SIGTERM, signal.SIGINT, signal.SIGHUP), handle):
            yield

    # -- after the command ------------------------------------------------------

    def _finish(self, *, command_ok: bool) -> list[str]:
        """Upload outputs (even when the command failed, as Azure ML does),
        register assets only for a successful command, then unmount inputs."""
        problems: list[str] = []
        for item in self.prepared:
            entry = item.entry
            if entry.direction != "output":
                continue
            where = f"outputs.{entry.name}"
            try:
                if item.mountpoint is not None:
                    # An upload output uploads (and registers) at its unmount.
                    how = modes.finish(self.ctx, item.mountpoint, register=command_ok)
                    self.say(f"{where}: {how}")
                if command_ok and entry.mode is not Mode.UPLOAD:
                    registered = register_output(self.ctx, self.spec, entry)
                    if registered:
                        self.say(f"{where}: registered {registered}")
            except DatamountError as exc:
                problems.append(str(exc))
            if entry.asset_name and not command_ok:
                log.info("%s: not registered as %s (the command failed)", where, entry.asset_name)
        return problems

    def _undo(self, *, inputs_only: bool = False) -> None:
        """Unmount inputs (and, before the command, forget outputs)."""
        settings = self.ctx.settings
        for item in self.prepared:
            if item.mountpoint is None or (inputs_only and item.entry.direction == "output"):
                continue
            record = upload_records.read_record(settings.cache_dir, item.mountpoint)
            if record is not None:  # an upload output of a job that never ran
                upload_records.finish(settings.cache_dir, record)
                continue
            try:
                modes.finish(self.ctx, item.mountpoint)
            except DatamountError as exc:
                log.warning("%s: unmount failed: %s", item.mountpoint, exc)


def _exit_reason(code: int) -> str:
    """'exited with 0', 'was killed by SIGKILL (exit 137)'."""
    if code > 128:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(code - 128).name} (exit {code})"
    return f"exited with {code}"


def cleanup(workdir: Path, cache_dir: Path, *, remove: bool, keep_logs: bool) -> str | None:
    """Remove the working folder (keeping `system_logs` when asked). Never
    deletes through a mount (an output still mounted would lose its data in
    storage) nor an upload output whose upload failed: the folder is kept
    then, and the returned line says why."""
    if not remove:
        return None
    root = table.mount_key(workdir)
    mounted = [m.mountpoint for m in table.mounts() if m.mountpoint.startswith(root + "/")]
    if mounted:
        return f"kept {workdir}: still mounted there: {', '.join(mounted)}"
    pending = upload_records.pending_under(cache_dir, workdir)
    if pending:
        return (
            f"kept {workdir}: outputs not uploaded yet (run `datamount unmount FOLDER` "
            f"to upload them): {', '.join(pending)}"
        )
    if not keep_logs:
        shutil.rmtree(workdir, ignore_errors=True)
        return None
    for child in workdir.iterdir():
        if child.name != "system_logs":
            shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
    return None
