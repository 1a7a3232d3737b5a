"""A copy's plan, page by page: which files of a listing page the Downloader
(transfer.downloader) fetches, and whether the disk has room for them before
any of them starts.

- A file the resume manifest has complete (same size and etag, still there)
  is skipped; so is the second of two objects that land at one local path
  ('a//b' and 'a/b': doubled slashes collapse), with a warning naming it.
- The free-space check runs on each page: its files' bytes against what the
  disk had at the start, less the reserve and what earlier pages will write.
- A big file's requests: spans of up to SPAN_RANGES ranges (`span_ranges`).

Threads: the Downloader's calling thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from datamount.errors import DataError
from datamount.transfer.manifest import MANIFEST_NAME, Manifest
from datamount.transfer.partfile import disk_free, existing
from datamount.transfer.progress import Progress, human
from datamount.transfer.source import SourceFile

log = logging.getLogger("datamount.transfer.download")  # its lines are the download's


# A big file is fetched in spans of up to this many ranges: one GET each,
# read through the thread's range-size buffer (memory stays threads x range).
# Why 8: docs/design/download.md ("Spans").
SPAN_RANGES = 8


def span_ranges(size: int, range_size: int, threads: int) -> int:
    """Ranges per GET for a file of `size`: up to SPAN_RANGES, as long as
    each of `threads` still gets two spans of it (1: a GET per range)."""
    return max(1, min(SPAN_RANGES, size // (range_size * threads * 2)))


class NotEnoughSpace(DataError):
    pass


@dataclass
class Plan:
    dest: Path
    manifest: Manifest
    progress: Progress
    # Every local path planned: two objects never race for one file. Like the
    # manifest, a few dozen bytes per file: metadata, not data.
    landing: set[str]
    overwrite: bool
    reserve: int
    free: int = field(init=False)  # the disk's, less what planned pages will write
    budget: int = field(init=False)

    def __post_init__(self) -> None:
        self.free = disk_free(existing(self.dest))
        self.budget = self.free - self.reserve

    def page(self, page: list[SourceFile]) -> list[SourceFile]:
        """The files of `page` to fetch; NotEnoughSpace if they do not fit."""
        todo = []
        for src in page:
            final = self.dest / src.rel
            if src.rel == MANIFEST_NAME:
                raise DataError(f"{src.key}: collides with datamount's manifest name")
            if src.rel in self.landing:  # 'a//b' and 'a/b': one local path, two objects
                log.warning(
                    "%s: skipped: another object already lands at %s (names that differ "
                    "only in doubled slashes)", src.key, final,
                )  # fmt: skip
                continue
            self.landing.add(src.rel)
            self.progress.planned(1, src.size)
            if not self.overwrite and self.manifest.is_complete(src.rel, src.size, src.etag, final):
                self.progress.skipped(1, src.size)
                continue
            todo.append(src)
        need = sum(f.size for f in todo)
        if need > self.budget:
            raise NotEnoughSpace(
                f"not enough disk space in {self.dest}: need {human(need)} plus "
                f"{human(self.reserve)} reserved (DATASET_RESERVED_FREE_DISK_SPACE), "
                f"{human(max(self.free, 0))} free"
            )
        self.budget -= need
        self.free -= need
        return todo
