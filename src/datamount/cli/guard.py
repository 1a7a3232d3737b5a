"""How a command ends, in one place: a DatamountError as its message on
stderr and its exit code, an OSError of the local disk as one line naming the
path (exit 3, or 4 for the outputs' commands), anything unexpected as one
line with the traceback in the runtime log; and the logs a command starts
(a log folder the user named that cannot be used is exit 3, the default one
a warning). Every command body runs under `guarded`. No threads.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from datamount import __version__, private
from datamount.cli.parser import PROG
from datamount.errors import (
    EXIT_FAILURE,
    DataError,
    DatamountError,
    OutputError,
    StorageError,
)
from datamount.log import RUNTIME_LOG, setup_logging, shutdown_logging
from datamount.settings import Settings

log = logging.getLogger("datamount.cli")


def guarded(command: str, settings: Settings, body: Callable[[], int]) -> int:
    """Run `body`: a DatamountError becomes its message and exit code, an OSError
    of the local disk one line naming the path (exit 3; 4 for `upload` and
    `unmount`, whose failures are the outputs'), anything unexpected one line
    (traceback in the runtime log)."""
    try:
        return body()
    except DatamountError as exc:
        log.info("%s failed: %s", command, exc)
        return fail(exc)
    except StorageError as exc:  # storage refused before any layer could say more
        log.info("%s failed: %s", command, exc)
        return fail(DataError(str(exc)))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        failure = disk_failure(command, exc)
        if failure is None:
            return unexpected(command, settings, exc)
        log.info("%s failed: %s", command, exc, exc_info=True)
        return fail(failure)
    except Exception as exc:  # the last line of defence: one line, traceback in the log
        return unexpected(command, settings, exc)
    finally:
        shutdown_logging()


# A local-disk errno that says what is wrong even without a path: the disk's state.
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def disk_failure(command: str, exc: OSError) -> DatamountError | None:
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


def unexpected(command: str, settings: Settings, exc: Exception) -> int:
    """One line; the traceback goes to the runtime log, named only if it exists."""
    log.exception("unexpected error in %s", command)
    runtime = settings.log_dir / RUNTIME_LOG
    details = f" (details in {settings.log_dir})" if runtime.is_file() else ""
    print(f"{PROG}: error: unexpected {type(exc).__name__}: {exc}{details}", file=sys.stderr)
    return EXIT_FAILURE


def log_dir_given(flag: object, environ: Mapping[str, str]) -> bool:
    """Whether the log folder was named (`--log-dir`, DATAMOUNT_LOG_DIR), not the default."""
    return flag is not None or bool(environ.get("DATAMOUNT_LOG_DIR", "").strip())


def start_logging(settings: Settings, command: str, *, explicit: bool) -> None:
    """The command's two logs in `settings.log_dir`. A folder the user named
    (`explicit`) that cannot be used is DataError (exit 3: nothing started);
    the default folder unusable is one `warning:` line, and the command goes
    on without logs."""
    log_dir, cache = settings.log_dir, settings.cache_dir
    in_cache = log_dir.is_relative_to(cache)
    if in_cache:  # the default: nothing is written into another user's cache
        try:
            private.refuse_foreign(cache)
        except private.NotPrivate as exc:
            raise DataError(f"cache folder {exc}") from None
    try:
        _make_log_dir(log_dir)
    except OSError as exc:
        if explicit:
            raise DataError(f"cannot create log folder {log_dir}: {_reason(exc)}") from None
        return _without_logs(log_dir, exc)
    try:
        files = setup_logging(log_dir, level=settings.log_level, settings_lines=settings.describe())
    except OSError as exc:
        if explicit:
            raise DataError(f"cannot write logs to {log_dir}: {_reason(exc)}") from None
        return _without_logs(log_dir, exc)
    log.info("datamount %s: %s (logs in %s)", __version__, command, files.runtime.parent)
    if in_cache:  # every command, download included: the cache made private (logged)
        with contextlib.suppress(OSError):
            private.private_root(cache)


def _make_log_dir(log_dir: Path) -> None:
    """The log folder and its missing parents, 0700 as every folder of the cache."""
    if log_dir.exists() and not log_dir.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "a file of that name is in the way")
    try:
        private.folders(log_dir)
    except FileExistsError:  # a parent is a file
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)) from None


def _without_logs(log_dir: Path, exc: OSError) -> None:
    print(f"{PROG}: warning: cannot write logs to {log_dir}: {_reason(exc)}", file=sys.stderr)
    # Without a log file, logging's last resort would print every warning and
    # traceback on stderr: the user has the warning, the error gets its one line.
    logging.getLogger("datamount").addHandler(logging.NullHandler())


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def fail(exc: DatamountError) -> int:
    for line in str(exc).splitlines() or [type(exc).__name__]:
        print(f"{PROG}: error: {line}", file=sys.stderr)
    return exc.exit_code
