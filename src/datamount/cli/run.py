"""`datamount run JOB.yml`: one Azure ML job on this node, its settings from
the environment plus the job's environment_variables, logging in its working
folder (`--workdir`, default a temporary folder removed at the end; kept with
--keep).

- A command job: checked, then run start to end (jobs/commandjob.py).
- A pipeline job: the whole pipeline checked (nothing starts on a bad one:
  exit 2), then its steps run (jobs/pipelinejob.py), each step's
  `system_logs` kept when a step failed. The parallelism is
  DATAMOUNT_PIPELINE_PARALLEL (default 2).

No threads of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from datamount.cli import assets
from datamount.cli.guard import fail, guarded, start_logging
from datamount.errors import EXIT_OK, DatamountError, SpecError
from datamount.jobs import commandjob, environment
from datamount.jobs.pipelinejob import PipelineRun
from datamount.jobspec.job import load_spec
from datamount.modes.context import Context
from datamount.settings import Settings


def run(args: argparse.Namespace) -> int:
    """`run JOB`: a pipeline job (run_pipeline), or a command job: checked
    with settings from the environment plus the job's environment_variables,
    then run in its working folder, logging there."""
    kind = assets.file_kind(Path(args.job))
    if kind == "sweep":
        return fail(SpecError(f"{args.job}: {assets.SWEEP}"))
    if kind == "pipeline":
        return run_pipeline(args)
    try:
        run_name = commandjob.run_name(load_spec(Path(args.job)).name)
        spec = load_spec(Path(args.job), run_name=run_name)
        env = _with_restarts(args, {**os.environ, **spec.environment_variables})
        settings = Settings.from_env(env, cache_dir=args.cache_dir, log_dir=args.log_dir)
        commandjob.check(Context(settings, env, Path.cwd(), args.workspace, run_name), spec)
        ctx, workdir = _in_workdir(args, run_name, env)
    except DatamountError as exc:
        return fail(exc)
    settings = ctx.settings
    temporary = args.workdir is None
    say = environment.say

    def body() -> int:
        return commandjob.JobRun(ctx, spec, workdir, say=say).run()

    code = guarded("run", settings, body)
    keep_logs = code != EXIT_OK and temporary and not args.keep
    kept = commandjob.cleanup(
        workdir, settings.cache_dir, remove=temporary and not args.keep, keep_logs=keep_logs
    )
    if kept:
        say(kept)
    if args.keep or keep_logs or kept:
        say(f"logs in {settings.log_dir}")
    return code


def run_pipeline(args: argparse.Namespace) -> int:
    path = Path(args.job)
    env = _with_restarts(args, dict(os.environ))  # the steps' `datamount run` inherit it
    try:
        run = commandjob.run_name(path.stem)
        settings = Settings.from_env(env, cache_dir=args.cache_dir, log_dir=args.log_dir)
        parallel = settings.pipeline_parallel
        ctx = Context(settings, env, Path.cwd(), args.workspace, run)
        pipeline, jobs = assets.prepare_run(ctx, path)
        ctx, workdir = _in_workdir(args, run, env)
    except DatamountError as exc:
        return fail(exc)
    settings = ctx.settings
    temporary = args.workdir is None
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


def _with_restarts(args: argparse.Namespace, env: dict[str, str]) -> dict[str, str]:
    """`--max-restarts N` wins over DATAMOUNT_RUN_MAX_RESTARTS, `--max-retries
    N` over DATAMOUNT_RUN_MAX_RETRIES (a job's environment_variables included)."""
    if getattr(args, "max_restarts", None) is not None:
        env["DATAMOUNT_RUN_MAX_RESTARTS"] = str(args.max_restarts)
    if getattr(args, "max_retries", None) is not None:
        env["DATAMOUNT_RUN_MAX_RETRIES"] = str(args.max_retries)
    return env


def _in_workdir(
    args: argparse.Namespace, run_name: str, env: dict[str, str]
) -> tuple[Context, Path]:
    """The run's working folder and the context of a run in it, its logs
    started there. DatamountError (a bad folder or setting): nothing started."""
    workdir, settings = environment.workdir_settings(
        args.workdir, run_name, env, args.cache_dir, args.log_dir
    )
    try:
        start_logging(settings, "run", explicit=args.log_dir is not None)
    except DatamountError:
        if args.workdir is None:  # the temporary folder just made: nothing else is in it
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    return Context(settings, env, Path.cwd(), args.workspace, run_name), workdir


def _cleanup(workdir: Path, cache_dir: Path, *, keep_logs: bool) -> None:
    """Each step's folder goes through commandjob.cleanup (never through a mount)."""
    for child in list(workdir.iterdir()):
        if child.is_dir() and child.name != "system_logs":
            commandjob.cleanup(child, cache_dir, remove=True, keep_logs=keep_logs)
    if not keep_logs:
        shutil.rmtree(workdir, ignore_errors=True)
