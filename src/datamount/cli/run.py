"""`datamount run PIPELINE.yml`: check the whole pipeline (nothing starts on
a bad one: exit 2), then run its steps (runner.py) in `--workdir` (default
a temporary folder, removed at the end but for each step's `system_logs`
when a step failed, or kept whole with --keep). The parallelism is
DATAMOUNT_PIPELINE_PARALLEL (default 2). No threads of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from datamount.cli.assets import prepare_run
from datamount.errors import EXIT_OK, DatamountError, SettingsError
from datamount.jobs import commandjob, environment
from datamount.jobs.pipelinejob import PipelineRun
from datamount.modes.context import Context
from datamount.settings import Settings

DEFAULT_PARALLEL = 2


def run_pipeline(
    args: argparse.Namespace,
    *,
    start_logging: Callable[[Settings, str], None],
    fail: Callable[[DatamountError], int],
    guarded: Callable[[str, Settings, Callable[[], int]], int],
) -> int:
    path = Path(args.job)
    env = dict(os.environ)
    try:
        parallel = _parallel(env)
        run = commandjob.run_name(path.stem)
        settings = Settings.from_env(env, cache_dir=args.cache_dir, log_dir=args.log_dir)
        ctx = Context(settings, env, Path.cwd(), args.workspace, run)
        pipeline, jobs = prepare_run(ctx, path)
    except DatamountError as exc:
        return fail(exc)
    temporary = args.workdir is None
    try:
        workdir, settings = environment.workdir_settings(
            args.workdir, run, env, args.cache_dir, args.log_dir
        )
    except DatamountError as exc:
        return fail(exc)
    start_logging(settings, "run")
    ctx = Context(settings, env, Path.cwd(), args.workspace, run)
    argv = [sys.executable, "-m", "datamount.cli.main"]
    if ctx.workspace_path().is_file():
        argv += ["--workspace", str(ctx.workspace_path().resolve())]
    argv += ["--cache-dir", str(settings.cache_dir)]
    say = environment.say

    say(f"pipeline {run}: {len(jobs)} steps in {workdir}, up to {parallel} at a time")
    runner = PipelineRun(ctx, pipeline, jobs, workdir, argv=argv, say=say, parallel=parallel)
    code = guarded("run", settings, runner.run)
    if temporary and not args.keep:
        _cleanup(workdir, settings.cache_dir, keep_logs=code != EXIT_OK)
        if code != EXIT_OK:
            say(f"step logs kept in {workdir}/<step>/system_logs")
    return code


def _parallel(env: dict[str, str]) -> int:
    raw = env.get("DATAMOUNT_PIPELINE_PARALLEL", str(DEFAULT_PARALLEL))
    if not raw.isdigit() or int(raw) < 1:
        raise SettingsError(f"DATAMOUNT_PIPELINE_PARALLEL: {raw!r} is not a whole number >= 1")
    return int(raw)


def _cleanup(workdir: Path, cache_dir: Path, *, keep_logs: bool) -> None:
    """Each step's folder goes through commandjob.cleanup (never through a mount)."""
    for child in list(workdir.iterdir()):
        if child.is_dir() and child.name != "system_logs":
            commandjob.cleanup(child, cache_dir, remove=True, keep_logs=keep_logs)
    if not keep_logs:
        shutil.rmtree(workdir, ignore_errors=True)
