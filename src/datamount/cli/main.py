"""Command line: parse arguments, read Settings once, call a mode handler
(modes) or a command of the run context (context).

It reads os.environ for the commands; below it only the library entry points
that are their own composition roots do (the fsspec protocol and
`mltable.load`, for the workspace), and fs/fuse_adapter sets libfuse's
FUSE_LIBRARY_NAME before mfusepy loads. It prints to the user; the mount
daemon (mount.serve) prints only to the runtime log its stdio goes to. Every
DatamountError becomes its message on stderr and its exit code; anything
unexpected becomes one line plus a traceback in the runtime log.

Start-up time is part of every transfer's wall time (a 1 GiB download takes under
a second here), so the modules only some commands need (modes, mount, jobrun,
status) are imported inside those commands.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from datamount import __version__
from datamount.cli.parser import GLOBAL_OPTIONS, PROG, build_parser, parse_args
from datamount.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    DataError,
    DatamountError,
    OutputError,
    SpecError,
    StorageError,
)
from datamount.jobspec.job import load_spec
from datamount.log import RUNTIME_LOG, setup_logging, shutdown_logging
from datamount.modes.context import Context, resolve, validate
from datamount.settings import Settings
from datamount.transfer.progress import Progress, human

log = logging.getLogger("datamount.cli")
__all__ = ["GLOBAL_OPTIONS", "PROG", "build_parser", "entry", "main", "parse_args"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "run":
        return _run_job(args)
    try:
        settings = Settings.from_env(os.environ, cache_dir=args.cache_dir, log_dir=args.log_dir)
    except DatamountError as exc:
        return _fail(exc)
    _start_logging(settings, args.command)
    ctx = Context(settings, dict(os.environ), Path.cwd(), args.workspace)
    return _guarded(args.command, settings, lambda: _run(ctx, args))


def _guarded(command: str, settings: Settings, body: Callable[[], int]) -> int:
    """Run `body`: a DatamountError becomes its message and exit code, an OSError
    of the local disk one line naming the path (exit 3; 4 for `upload` and
    `unmount`, whose failures are the outputs'), anything unexpected one line
    (traceback in the runtime log)."""
    try:
        return body()
    except DatamountError as exc:
        log.info("%s failed: %s", command, exc)
        return _fail(exc)
    except StorageError as exc:  # storage refused before any layer could say more
        log.info("%s failed: %s", command, exc)
        return _fail(DataError(str(exc)))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        failure = _disk_failure(command, exc)
        if failure is None:
            return _unexpected(command, settings, exc)
        log.info("%s failed: %s", command, exc, exc_info=True)
        return _fail(failure)
    except Exception as exc:  # the last line of defence: one line, traceback in the log
        return _unexpected(command, settings, exc)
    finally:
        shutdown_logging()


# A local-disk errno that says what is wrong even without a path: the disk's state.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def _disk_failure(command: str, exc: OSError) -> DatamountError | None:
    """The one line of an OSError raised by the local disk: it names a path (or
    says the disk is full or read-only), so the data could not be prepared
    (exit 3), or for `upload` / `unmount` the outputs not written (exit 4).
    None for an OSError that says neither (a bug: reported as unexpected)."""
    if exc.filename is None and exc.errno not in _DISK_ERRNOS:
        return None
    reason = exc.strerror or os.strerror(exc.errno or 0) or type(exc).__name__
    where = "the local disk" if exc.filename is None else os.fsdecode(exc.filename)
    if exc.filename2 is not None:
        where = f"{where} -> {os.fsdecode(exc.filename2)}"
    message = f"{where}: {reason}"
    return OutputError(message) if command in ("upload", "unmount") else DataError(message)


def _unexpected(command: str, settings: Settings, exc: Exception) -> int:
    """One line; the traceback goes to the runtime log, named only if it exists."""
    log.exception("unexpected error in %s", command)
    runtime = settings.log_dir / RUNTIME_LOG
    details = f" (details in {settings.log_dir})" if runtime.is_file() else ""
    print(f"{PROG}: error: unexpected {type(exc).__name__}: {exc}{details}", file=sys.stderr)
    return EXIT_FAILURE


def _run(ctx: Context, args: argparse.Namespace) -> int:
    commands = {
        "validate": _validate,
        "resolve": _resolve,
        "download": _download,
        "upload": _upload,
        "mount": _mount,
        "unmount": _unmount,
        "status": _status,
        "data": _create,
        "component": _create,
    }
    commands[args.command](ctx, args)
    return EXIT_OK


def _validate(ctx: Context, args: argparse.Namespace) -> None:
    from datamount.cli import assets

    kind = assets.file_kind(Path(args.spec))
    if kind != "job":
        print(assets.validate_file(ctx, Path(args.spec), kind))
        return
    result = validate(ctx, Path(args.spec))
    spec = result.spec
    checked = (
        f"datastores and assets checked against {result.workspace_checked}"
        if result.workspace_checked
        else f"workspace not checked: {ctx.workspace_path()} not found"
    )
    print(
        f"{args.spec}: valid ({spec.shape} spec, {len(spec.data_inputs)} data inputs, "
        f"{len(spec.outputs)} outputs; {checked})"
    )


def _create(ctx: Context, args: argparse.Namespace) -> None:
    from datamount.cli import assets

    create = assets.data_create if args.command == "data" else assets.component_create
    print(f"{PROG}: {create(ctx, Path(args.file), args.version)}", file=sys.stderr)


def _resolve(ctx: Context, args: argparse.Namespace) -> None:
    for _name, uri in resolve(ctx, args.spec, args.input):
        print(uri)


def _download(ctx: Context, args: argparse.Namespace) -> None:
    from datamount.modes import download

    with _progress("download", ctx.settings) as progress:
        result = download.download(
            ctx, args.source, Path(args.dest), name=args.input, overwrite=args.overwrite,
            progress=progress, shard=download.Shard.from_context(ctx) if args.shard else None,
        )  # fmt: skip
    print(result.path)
    print(_summary("downloaded", result.files, result.bytes, result.seconds,
                   result.skipped_files, "already complete"), file=sys.stderr)  # fmt: skip


def _upload(ctx: Context, args: argparse.Namespace) -> None:
    from datamount.modes import download

    with _progress("upload", ctx.settings) as progress:
        result = download.upload(
            ctx, Path(args.src), args.dest, name=args.output,
            overwrite=args.overwrite, progress=progress,
        )  # fmt: skip
    print(_summary("uploaded", result.files, result.bytes, result.seconds,
                   result.skipped_files, "unchanged"), file=sys.stderr)  # fmt: skip


def _mount(ctx: Context, args: argparse.Namespace) -> None:
    from datamount import modes

    printed: list[Path] = []

    def ready(path: Path) -> None:  # --foreground: the path as soon as the mount answers
        print(path, flush=True)
        printed.append(path)

    spec = ctx.load_spec(Path(args.spec))
    how = modes.How(
        progress=_progress("download", ctx.settings),  # entered around a download only
        foreground=args.foreground,
        on_ready=ready,
    )
    path = modes.prepare(ctx, spec, spec.entry(args.input), Path(args.mountpoint), how)
    if not printed:
        print(path)


def _run_job(args: argparse.Namespace) -> int:
    """`run`: check the job with settings from the environment plus the job's
    environment_variables, then run it in its working folder, logging there."""
    from datamount.cli import assets
    from datamount.jobs import commandjob, environment

    kind = assets.file_kind(Path(args.job))
    if kind == "sweep":
        return _fail(SpecError(f"{args.job}: {assets.SWEEP}"))
    if kind == "pipeline":
        from datamount.cli.run import run_pipeline

        return run_pipeline(args, start_logging=_start_logging, fail=_fail, guarded=_guarded)
    try:
        run_name = commandjob.run_name(load_spec(Path(args.job)).name)
        spec = load_spec(Path(args.job), run_name=run_name)
        env = {**os.environ, **spec.environment_variables}
        settings = Settings.from_env(env, cache_dir=args.cache_dir, log_dir=args.log_dir)
        commandjob.check(Context(settings, env, Path.cwd(), args.workspace, run_name), spec)
    except DatamountError as exc:
        return _fail(exc)
    temporary = args.workdir is None
    try:
        workdir, settings = environment.workdir_settings(
            args.workdir, run_name, env, args.cache_dir, args.log_dir
        )
    except DatamountError as exc:
        return _fail(exc)
    _start_logging(settings, "run")
    ctx = Context(settings, env, Path.cwd(), args.workspace, run_name)
    say = environment.say

    def body() -> int:
        return commandjob.JobRun(ctx, spec, workdir, say=say).run()

    code = _guarded("run", settings, body)
    keep_logs = code != EXIT_OK and temporary and not args.keep
    kept = commandjob.cleanup(
        workdir, settings.cache_dir, remove=temporary and not args.keep, keep_logs=keep_logs
    )
    if kept:
        say(kept)
    if args.keep or keep_logs or kept:
        say(f"logs in {settings.log_dir}")
    return code


def _status(ctx: Context, args: argparse.Namespace) -> None:
    from datamount.cli import status

    if args.ready is not None:
        why = status.ready(Path(args.ready))
        if why is not None:
            raise DatamountError(f"{args.ready}: not ready: {why}")  # exit 1
        print(f"{args.ready}: ready")
        return
    if args.watch is not None:
        with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
            _watch(ctx, args, args.watch)
        return
    entries = status.collect(ctx.settings.cache_dir)
    for entry in entries:
        print(json.dumps(entry.as_dict(), sort_keys=True) if args.json else status.describe(entry))
    if not entries and not args.json:
        print(f"{PROG}: nothing mounted (cache {ctx.settings.cache_dir})", file=sys.stderr)


def _watch(ctx: Context, args: argparse.Namespace, seconds: float) -> None:
    """`status --watch`: a redrawn table on a terminal (plain ANSI), else one
    line per mount per refresh (JSON with --json). Ctrl-C ends it (exit 0)."""
    import time

    from datamount.cli import status

    tty = sys.stdout.isatty() and not args.json
    while True:
        entries = status.collect(ctx.settings.cache_dir)
        if tty:
            rows = status.table(entries) if entries else ["nothing mounted"]
            sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(rows) + "\n")
        else:
            now = time.time()
            for entry in entries:
                line = (
                    json.dumps({**entry.as_dict(), "time": now}, sort_keys=True)
                    if args.json
                    else f"{time.strftime('%H:%M:%S')} {status.describe(entry, now)}"
                )
                sys.stdout.write(line + "\n")
        sys.stdout.flush()
        time.sleep(seconds)


def _unmount(ctx: Context, args: argparse.Namespace) -> None:
    from datamount import modes

    how = modes.finish(ctx, Path(args.mountpoint), timeout=args.timeout)
    print(f"{PROG}: {args.mountpoint}: {how}", file=sys.stderr)


def _progress(verb: str, settings: Settings) -> Progress:
    """The progress line; with DATAMOUNT_METRICS_PORT, its counters as metrics too."""
    port = settings.metrics_port
    metrics = None if port is None else (settings.metrics_host, port)
    return Progress(verb, sys.stderr, tty=sys.stderr.isatty(), metrics=metrics)


def _summary(verb: str, files: int, nbytes: int, seconds: float, skipped: int, why: str) -> str:
    rate = nbytes / max(seconds, 1e-9) / 1e6
    return (
        f"{PROG}: {verb} {files} files, {human(nbytes)} in {seconds:.1f} s ({rate:.0f} MB/s); "
        f"{skipped} skipped ({why})"
    )


def _start_logging(settings: Settings, command: str) -> None:
    try:
        files = setup_logging(
            settings.log_dir, level=settings.log_level, settings_lines=settings.describe()
        )
    except OSError as exc:
        print(
            f"{PROG}: warning: cannot write logs to {settings.log_dir}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        # Without a log file, logging's last resort would print every warning and
        # traceback on stderr: the user has the warning, the error gets its one line.
        logging.getLogger("datamount").addHandler(logging.NullHandler())
        return
    log.info("datamount %s: %s (logs in %s)", __version__, command, files.runtime.parent)


def _fail(exc: DatamountError) -> int:
    for line in str(exc).splitlines() or [type(exc).__name__]:
        print(f"{PROG}: error: {line}", file=sys.stderr)
    return exc.exit_code


def entry() -> None:
    """The `datamount` console script: main(), then exit without the interpreter's
    teardown (~25 ms of module and object freeing on every command, measured on a
    1 GiB download). Everything that must reach disk or the terminal is done by
    then: main() has joined its workers and shut logging down; stdout and stderr
    are flushed here."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError):  # a closed pipe: nothing more to say to it
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover  (the mount daemon: a normal exit)
    sys.exit(main())
