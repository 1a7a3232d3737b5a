"""Every YAML file the CLI reads (specs, pipelines, components, data assets,
workspaces, the asset registry, the run history, MLTable files), read one
way: a file that is not a readable regular file (a folder, a FIFO, a device),
is too large, is not UTF-8 text or is not valid YAML becomes ONE line naming
the file and, for YAML and UTF-8, the line and column: `label: reason`,
raised as the caller's InvalidInput class (exit 2). A FIFO is opened
non-blocking and refused, so reading never hangs. No threads.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from datamount.errors import InvalidInput

MAX_BYTES = 16 * 1024 * 1024  # a spec or workspace is kilobytes; a dataset given by mistake is not

Error = Callable[[str], InvalidInput]

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def load(
    path: Path, label: str, error: Error, *, if_missing: Callable[[], Any] | None = None
) -> Any:
    """The YAML document of the file at `path` (None when it is empty).
    Every failure is `error(f"{label}: {reason}")`; a missing file is
    `if_missing()` when given."""
    text = read_text(path, label, error, missing_ok=if_missing is not None)
    if text is None and if_missing is not None:
        return if_missing()
    return parse(text or "", label, error)


def read_text(path: Path, label: str, error: Error, *, missing_ok: bool = False) -> str | None:
    """The text of the regular file at `path` (a UTF-8 BOM dropped); None
    when there is no such file and `missing_ok`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise error(f"{label}: cannot read it: no such file") from None
    except OSError as exc:
        raise error(f"{label}: cannot read it: {_reason(exc)}") from None
    try:
        return decode(_read_regular(fd, label, error), label, error)
    except OSError as exc:
        raise error(f"{label}: cannot read it: {_reason(exc)}") from None
    finally:
        os.close(fd)


def _read_regular(fd: int, label: str, error: Error) -> bytes:
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        raise error(f"{label}: is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise error(f"{label}: not a regular file ({_KINDS.get(stat.S_IFMT(mode), 'special')})")
    chunks, size = [], 0
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BYTES:
            raise error(f"{label}: too large for a YAML file (over {MAX_BYTES >> 20} MiB)")
    return b"".join(chunks)


def decode(data: bytes, label: str, error: Error) -> str:
    """`data` as UTF-8 text (a BOM dropped), or one line saying where it is not."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, column = _line_column(data, exc.start)
        raise error(
            f"{label}: not a UTF-8 text file (byte 0x{data[exc.start]:02x} "
            f"at line {line}, column {column})"
        ) from None


def parse(text: str, label: str, error: Error) -> Any:
    """The YAML document in `text` (None when empty), or one line: the
    parser's problem, its line and column, and its context folded in."""
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        raise error(f"{label}: not valid YAML{_at(exc.problem_mark)}: {_problem(exc)}") from None
    except yaml.reader.ReaderError as exc:
        line, column = _line_column(text, exc.position)
        raise error(
            f"{label}: not valid YAML (line {line}, column {column}): "
            f"unacceptable character #x{exc.character:04x}: {exc.reason}"
        ) from None
    except yaml.YAMLError as exc:
        raise error(f"{label}: not valid YAML: {_fold(str(exc))}") from None
    except RecursionError:
        raise error(f"{label}: not valid YAML: nested too deeply") from None
    except ValueError as exc:  # a scalar PyYAML resolves but cannot build (2024-13-01)
        raise error(f"{label}: not valid YAML: {_fold(str(exc))}") from None


def _problem(exc: yaml.MarkedYAMLError) -> str:
    problem = _fold(exc.problem or exc.context or "invalid YAML")
    if exc.context and exc.problem:
        where = _where(exc.context_mark)
        problem += f" ({_fold(exc.context)}{f' at {where}' if where else ''})"
    return problem


def _at(mark: Any) -> str:
    where = _where(mark)
    return f" ({where})" if where else ""


def _where(mark: Any) -> str:
    return "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}"


def _line_column(data: bytes | str, offset: int) -> tuple[int, int]:
    newline = b"\n" if isinstance(data, bytes) else "\n"
    start = data.rfind(newline, 0, offset) + 1  # type: ignore[arg-type]
    return data.count(newline, 0, offset) + 1, offset - start + 1  # type: ignore[arg-type]


def _fold(text: str) -> str:
    return " ".join(text.split())


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__
