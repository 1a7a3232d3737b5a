"""Log setup: the activity log and the runtime log, both with secrets masked,
and `Secret`, the string type that prints as '***'.

One job: route the stdlib loggers into two files of one folder.

- `data-capability.log`: one line when an activity starts and one when it ends
  (`activity()`), from the "datamount.activity" logger only.
- `datamount-runtime.log`: everything under the "datamount" logger, opened with
  the effective settings.

Both are private (0600, in a folder created 0700: datamount.private), like
the cache they usually live in: they name blobs and mount points.

Neither propagates to the root logger, so nothing reaches stderr unless the CLI
adds its own handler (give it `RedactingFilter()` too). Every line passes
`redact()`: SAS signatures, AccountKey=/SharedAccessSignature= in connection
strings and every value given to `register_secret()` become '***'.

Thread-safe (logging's handler locks; one lock guards setup and the secret
set).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from datamount import private

CAPABILITY_LOG = "data-capability.log"
RUNTIME_LOG = "datamount-runtime.log"
ROOT_LOGGER = "datamount"
ACTIVITY_LOGGER = "datamount.activity"
MASK = "***"

# Shorter values would mask ordinary words; no key or SAS signature is this short.
_MIN_SECRET_LENGTH = 6
_PATTERNS = (
    # SAS signature in a URL or a bare token: ?sv=...&sig=<base64, maybe %-encoded>
    re.compile(r"(?<![A-Za-z0-9_])(sig=)[^&\s'\"<>;,]+", re.I),
    # Connection strings: AccountKey=...; SharedAccessSignature=...;
    re.compile(r"(AccountKey=|SharedAccessSignature=)[^;\s'\"]+", re.I),
)

_lock = threading.Lock()
_secrets: set[str] = set()
_secret_re: re.Pattern[str] | None = None
_handlers: list[tuple[logging.Logger, logging.Handler]] = []


class Secret:
    """A string that prints as '***'. Call `reveal()` only at the SDK boundary."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)


def register_secret(value: str | Secret) -> None:
    """Mask `value` (and its URL-encoded / decoded forms) in every later line."""
    global _secret_re
    text = value.reveal() if isinstance(value, Secret) else value
    forms = {text, text.strip().lstrip("?"), quote(text, safe=""), unquote(text)}
    with _lock:
        _secrets.update(f for f in forms if len(f) >= _MIN_SECRET_LENGTH)
        # Longest first, so a secret containing another is masked whole.
        ordered = sorted(_secrets, key=len, reverse=True)
        _secret_re = re.compile("|".join(map(re.escape, ordered))) if ordered else None


def clear_secrets() -> None:
    """Forget every registered secret (tests)."""
    global _secret_re
    with _lock:
        _secrets.clear()
        _secret_re = None


def redact(text: str) -> str:
    """`text` with registered secrets, SAS signatures and account keys masked."""
    pattern = _secret_re  # one read: registration swaps the compiled pattern whole
    if pattern is not None:
        text = pattern.sub(MASK, text)
    for known in _PATTERNS:
        text = known.sub(lambda m: m.group(1) + MASK, text)
    return text


class RedactingFilter(logging.Filter):
    """Rewrites each record's message and traceback text through `redact()`."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # bad %-args: keep the line, never let handleError print it raw
            message = f"{record.msg} (bad log arguments: {record.args!r})"
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


@dataclass(frozen=True)
class LogFiles:
    capability: Path
    runtime: Path


def _formatter(fmt: str) -> logging.Formatter:
    formatter = logging.Formatter(fmt, datefmt="%Y-%m-%dT%H:%M:%S")
    formatter.converter = time.gmtime  # UTC: nodes of one job agree on timestamps
    return formatter


def _file_handler(path: Path, fmt: str) -> logging.FileHandler:
    os.close(private.create(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))  # 0600 when new
    private.tighten(path)  # 0644 from an older version
    # backslashreplace: a local path that is not valid UTF-8 is logged escaped, not dropped.
    handler = logging.FileHandler(path, mode="a", encoding="utf-8", errors="backslashreplace")
    handler.setFormatter(_formatter(fmt))
    handler.addFilter(RedactingFilter())
    return handler


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelNamesMapping().get(level.strip().upper())
    if number is None:
        raise ValueError(f"unknown log level: {level!r}")
    return number


def setup_logging(
    log_dir: Path, *, level: str | int = "INFO", settings_lines: Sequence[str] = ()
) -> LogFiles:
    """Create `log_dir` and send the datamount loggers to its two files.

    Calling it again (same or another folder) closes the previous handlers
    first, so lines are never duplicated. Files are appended to; each setup
    starts the runtime log with `settings_lines`, whatever `level` is.
    """
    log_dir = Path(log_dir)
    private.folders(log_dir)
    files = LogFiles(log_dir / CAPABILITY_LOG, log_dir / RUNTIME_LOG)
    number = _level_number(level)
    with _lock:
        _close_handlers()
        capability = _file_handler(files.capability, "%(asctime)s.%(msecs)03dZ %(message)s")
        runtime = _file_handler(
            files.runtime,
            "%(asctime)s.%(msecs)03dZ %(levelname)s %(threadName)s %(name)s: %(message)s",
        )
        root, activity_logger = logging.getLogger(ROOT_LOGGER), logging.getLogger(ACTIVITY_LOGGER)
        root.setLevel(number)
        root.propagate = False
        activity_logger.setLevel(logging.INFO)  # activities are always recorded
        activity_logger.propagate = False
        for line in ["Effective settings:", *settings_lines]:
            runtime.handle(_record(f"{ROOT_LOGGER}.settings", logging.INFO, line))
        root.addHandler(runtime)
        activity_logger.addHandler(capability)
        _handlers.extend([(root, runtime), (activity_logger, capability)])
    return files


def shutdown_logging() -> None:
    """Detach and close the handlers setup_logging() added (idempotent)."""
    with _lock:
        _close_handlers()


def _close_handlers() -> None:
    while _handlers:
        logger, handler = _handlers.pop()
        logger.removeHandler(handler)
        handler.close()


def _record(name: str, level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 0, message, None, None)


def _fields(fields: dict[str, Any]) -> str:
    return "".join(f", {key}={value}" for key, value in fields.items())


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@contextmanager
def activity(name: str, **fields: Any) -> Iterator[None]:
    """Record the start and end (success or failure, with duration) of `name`.

    Lines: `ActivityStarted, <name>[, k=v...]` then
    `ActivityCompleted: Activity=<name>, HowEnded=Success, Duration=<ms> [ms][, k=v...]`
    or `HowEnded=Failure, ..., Error=<Type>: <first line>`. Failures re-raise.
    Also usable as a decorator.
    """
    logger = logging.getLogger(ACTIVITY_LOGGER)
    logger.info("ActivityStarted, %s%s", name, _fields(fields))
    start = time.monotonic()
    try:
        yield
    except BaseException as exc:
        ms = round((time.monotonic() - start) * 1000)
        logger.info(
            "ActivityCompleted: Activity=%s, HowEnded=Failure, Duration=%d [ms]%s, Error=%s",
            name,
            ms,
            _fields(fields),
            _one_line(exc),
        )
        raise
    ms = round((time.monotonic() - start) * 1000)
    logger.info(
        "ActivityCompleted: Activity=%s, HowEnded=Success, Duration=%d [ms]%s",
        name,
        ms,
        _fields(fields),
    )
