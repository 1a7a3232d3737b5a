"""The project's exceptions: each carries an exit code (CLI) and, for storage
errors, an errno (FUSE and OS callers).

Storage backends never raise these classes
directly from SDK code: `storage.errormap.translate` maps service errors onto them
through one table. No threads; plain exception classes.
"""

from __future__ import annotations

import errno
import os

# Exit codes of the CLI. 2 follows the argparse / Unix convention for bad input.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_INVALID = 2  # spec, settings, workspace or URI problems: nothing was started
EXIT_DATA = 3  # data could not be prepared (inputs)
EXIT_OUTPUTS = 4  # outputs could not be written


class DatamountError(Exception):
    """A failure with one clear, user-facing line (no traceback)."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInput(DatamountError):
    """Bad spec, URI, workspace or setting: reported before anything starts.

    `problems` holds one line per problem (each names the input and field).
    """

    exit_code = EXIT_INVALID

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class SpecError(InvalidInput):
    """The job spec does not follow the Azure ML rules."""


class UriError(InvalidInput):
    """A path could not be parsed into a Location."""


class Unreadable(str):
    """A problem line about a path the Azure ML SDK accepts but that names
    nothing datamount can ever read (UnreadablePath): `validate` says it as a
    warning, the commands that read refuse it. A str, so it travels in
    `InvalidInput.problems` like any line."""


class UnreadablePath(UriError):
    """A path the SDK's schemas accept that no storage serves to datamount: an
    account or container name Azure never issues, a scheme such as s3:// or
    adl://."""

    def __init__(self, problems: list[str] | str) -> None:
        lines = [problems] if isinstance(problems, str) else problems
        super().__init__([Unreadable(line) for line in lines])


def only_unreadable(exc: InvalidInput) -> bool:
    """Every problem of `exc` is an Unreadable one."""
    return bool(exc.problems) and all(isinstance(p, Unreadable) for p in exc.problems)


class WorkspaceError(InvalidInput):
    """A datastore, data asset or variable named by the spec is missing or bad."""


class SettingsError(InvalidInput):
    """An environment variable holds a value of the wrong shape."""


class DataError(DatamountError):
    """Input data could not be prepared (download failed, source missing...).

    `transient` says the cause may go away when tried again (a storage error
    that stayed transient through every retry, e.g. throttling or a reset).
    """

    exit_code = EXIT_DATA

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class OutputError(DatamountError):
    """Outputs could not be written to storage."""

    exit_code = EXIT_OUTPUTS


def os_error(code: int, what: str = "") -> OSError:
    """The OSError of errno `code`, naming `what` (a path, a key) when given:
    the one way the filesystem and write-back layers raise an errno. Python
    picks the subclass (ENOENT: FileNotFoundError, EISDIR: IsADirectoryError...)."""
    return OSError(code, os.strerror(code), what) if what else OSError(code, os.strerror(code))


class StorageError(OSError):
    """A storage request failed. Subclasses fix the errno.

    `transient` tells the retry policy the request may succeed if repeated;
    `retry_after` is the server's hint in seconds (Retry-After), if any.
    `exhausted` marks the final error of a transient failure whose retries
    were all spent: not transient any more for the request, but a whole
    operation (a job's input) may still be tried again later.
    """

    default_errno = errno.EIO

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        retry_after: float | None = None,
        status: int | None = None,
        err: int | None = None,
        exhausted: bool = False,
    ) -> None:
        super().__init__(err if err is not None else self.default_errno, message)
        self.transient = transient
        self.exhausted = exhausted
        self.retry_after = retry_after
        self.status = status

    def __str__(self) -> str:
        return str(self.strerror)


class ObjectNotFound(StorageError, FileNotFoundError):
    default_errno = errno.ENOENT


class AccessDenied(StorageError, PermissionError):
    default_errno = errno.EACCES


class VersionChanged(StorageError):
    """The object changed since its etag was pinned (HTTP 412 on If-Match)."""

    default_errno = errno.ESTALE


class Conflict(StorageError):
    default_errno = errno.EEXIST


class Throttled(StorageError):
    """429 / 503 after every retry was spent."""

    default_errno = errno.EAGAIN


class BadRequest(StorageError):
    default_errno = errno.EINVAL


class ReadOnlyError(StorageError):
    """A write to a store that has no write side (storage.base.ReadOnlyStore)."""

    default_errno = errno.EROFS
