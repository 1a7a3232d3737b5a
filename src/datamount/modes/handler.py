"""What every mode handler is (`Handler`: `prepare` before the job, `finish`
after it) and what a caller asks of `prepare` (`How`). The table of handlers
is the package's (modes/__init__.py). No threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from datamount.jobspec.job import DataInput, JobSpec
from datamount.modes.context import Context
from datamount.transfer.progress import Progress


@dataclass(frozen=True)
class How:
    """How a caller wants an entry prepared.

    `progress` reports a download (entered around the download only);
    FUSE mounts are served by a background daemon and `prepare` returns once
    the mount answers, or with `foreground` served in this process until
    unmounted, calling `on_ready` with the path once the mount answers."""

    progress: Progress | None = None
    foreground: bool = False
    on_ready: Callable[[Path], None] | None = None


class Handler(Protocol):
    """One mode. `prepare` returns what the job uses: a local path, or a URI
    for direct; `finish` what it did (one line)."""

    directions: tuple[str, ...]  # input, output: which may use it at all
    keeps_folder: bool  # the folder holds something `finish` must undo

    def prepare(
        self, ctx: Context, spec: JobSpec, entry: DataInput, folder: Path, how: How
    ) -> Path | str: ...

    def finish(
        self, ctx: Context, folder: Path, *, timeout: float | None, register: bool
    ) -> str: ...
