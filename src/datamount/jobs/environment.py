"""What a `datamount run` leaves around its command, as Azure ML does: the
environment variables the command gets for its inputs and outputs, and the
run's entry in the run history (workspace/runhistory.py) once it is over.

Azure ML gives a command job `AZURE_ML_INPUT_<name>` for every input (the
path or URI `${{inputs.<name>}}` becomes, or a literal's value),
`AZURE_ML_OUTPUT_<name>` for every output, and `AZUREML_RUN_ID` (the run's
name). Also the substitution of `${{inputs.x}}` / `${{outputs.y}}` in the
command. No threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

from datamount.errors import DatamountError, InvalidInput, SpecError
from datamount.jobspec.job import REFERENCE, DataInput, JobSpec
from datamount.jobspec.uris import LocationKind
from datamount.modes.context import Context
from datamount.settings import Settings
from datamount.workspace import runhistory

log = logging.getLogger("datamount.run")

INPUT_PREFIX = "AZURE_ML_INPUT_"
OUTPUT_PREFIX = "AZURE_ML_OUTPUT_"
RUN_ID = "AZUREML_RUN_ID"
# The attempt (1, 2, ...) of a command `datamount run` runs again after a
# transient end (DATAMOUNT_RUN_MAX_RESTARTS). Azure ML documents no variable
# for it; torchrun's own is TORCHELASTIC_RESTART_COUNT (0-based, its restarts).
ATTEMPT = "DATAMOUNT_RUN_ATTEMPT"


def make_workdir(workdir: str | None, run: str) -> Path:
    """A job's working folder: `--workdir DIR` (made when missing), or a new
    temporary folder named after the run. One DatamountError line when it cannot be made."""
    try:
        if workdir is None:
            return Path(tempfile.mkdtemp(prefix=f"datamount-{run}-"))
        path = Path(workdir).resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path
    except OSError as exc:
        raise DatamountError(f"--workdir {workdir}: {exc.strerror or exc}") from None


def workdir_settings(
    workdir: str | None,
    run: str,
    env: Mapping[str, str],
    cache_dir: Path | str | None,
    log_dir: Path | str | None,
) -> tuple[Path, Settings]:
    """The run's working folder (make_workdir) and its settings, whose log
    folder is `log_dir` or, as Azure ML has it, the workdir's
    system_logs/data_capability."""  # fmt: skip
    path = make_workdir(workdir, run)
    logs = log_dir or path / "system_logs" / "data_capability"
    return path, Settings.from_env(env, cache_dir=cache_dir, log_dir=logs)


def say(line: str) -> None:
    """One `datamount: ...` line on stderr. A closed stderr (a pipe to
    `head`, a hung-up terminal) must never stop a run from writing its
    outputs and unmounting: the line goes to the runtime log instead."""
    try:
        print(f"datamount: {line}", file=sys.stderr, flush=True)
    except OSError:
        log.info("%s (stderr closed)", line)


@contextlib.contextmanager
def handling(
    signals: Sequence[signal.Signals], handle: Callable[[int, FrameType | None], None]
) -> Iterator[None]:
    """`handle` for `signals` while the block runs; the handlers they had after it."""
    previous = {s: signal.signal(s, handle) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def command_env(environ: Mapping[str, str], values: Mapping[str, str], run: str) -> dict[str, str]:
    """`environ` plus the job's variables; `values` maps `inputs.x` /
    `outputs.y` to what the command line gets for them."""
    env = dict(environ)
    for ref, value in values.items():
        group, _, name = ref.partition(".")
        env[(INPUT_PREFIX if group == "inputs" else OUTPUT_PREFIX) + name] = value
    env[RUN_ID] = run
    return env


def landing(spec: JobSpec, entry: DataInput) -> str:
    """Where an output's bytes are, as a later spec may name them: its URI,
    or an absolute local path (relative ones are relative to the spec)."""
    if entry.location.kind is not LocationKind.LOCAL:
        return entry.path
    base = spec.source.parent if spec.source else Path.cwd()
    path = os.path.normpath(os.path.abspath(base / os.path.expanduser(entry.location.path)))
    return path + ("/" if entry.location.path.endswith("/") else "")


def record_run(ctx: Context, spec: JobSpec, exit_code: int) -> Path | None:
    """Add this run and its outputs to the run history (beside the workspace
    file; without one nothing is recorded). Returns the history's path."""
    try:
        workspace = ctx.load_workspace(required=False)
    except InvalidInput:
        return None
    history = workspace.history_path() if workspace is not None else None
    if history is None:
        log.info("no workspace file: run %s is not recorded in a run history", ctx.run_name)
        return None
    outputs = {
        name: runhistory.RunOutput(entry.type.value, landing(spec, entry))
        for name, entry in spec.outputs.items()
    }
    runhistory.record(history, ctx.run_name or spec.name, spec.name, exit_code, outputs)
    log.info("run %s recorded in %s", ctx.run_name or spec.name, history)
    return history


OPTIONAL_BLOCK = re.compile(r"\$\[\[(.*?)\]\]", re.DOTALL)


def substitute(command: str, values: dict[str, str]) -> str:
    """Replace every `${{inputs.x}}` / `${{outputs.y}}` by its value.

    `$[[ ... ]]` blocks (Azure ML's optional-argument syntax) are kept, without
    the brackets, when every reference inside has a value, and dropped
    otherwise (an optional input left out). A reference outside such a block
    without a value is a SpecError."""

    def block(match: re.Match[str]) -> str:
        inner = match.group(1)
        refs = REFERENCE.findall(inner)
        return inner if all(ref in values for ref in refs) else ""

    def value(match: re.Match[str]) -> str:
        ref = match.group(1)
        if ref not in values:
            raise SpecError(
                f"command: ${{{{{ref}}}}} has no value (an optional input left out is only "
                "allowed inside $[[...]])"
            )
        return values[ref]

    return REFERENCE.sub(value, OPTIONAL_BLOCK.sub(block, command))
