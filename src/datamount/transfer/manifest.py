"""The resume manifest: which files of a download are complete, by size and
etag, kept in the destination (or in a folder of the caller's) so a re-run
skips them.

One JSON object per line, appended (and flushed) as each file completes, or
as each group of files gets its final names (`record_many`: one write for the
group), so a killed run loses at most the files in flight. The first line names the source;
a manifest for another source is ignored. A manifest in the caller's folder
(the cache) is 0600 in a folder created 0700 (datamount.private); one in the
destination keeps the destination's modes. Thread-safe (one lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import TextIO

from datamount.private import FILE_MODE, folders

MANIFEST_NAME = ".datamount-manifest.jsonl"
# One entry: the bytes json.dumps({"rel": rel, "size": size, "etag": etag}) gives,
# without a dict and an encoder per file (its C string quoting, as dumps uses).
_LINE = '{"rel": %s, "size": %d, "etag": %s}\n'
_quote = json.encoder.encode_basestring_ascii


class Manifest:
    def __init__(self, dest: Path, source: str, folder: Path | None = None) -> None:
        """In `dest` itself, or — with `folder` (the CLI uses the cache) — in
        `folder`, named after `dest`'s absolute path, so the destination holds
        the data only (a job walking its input sees no extra file)."""
        self.private = folder is not None
        if folder is None:
            self.path = dest / MANIFEST_NAME
        else:
            digest = hashlib.sha256(os.path.abspath(dest).encode("utf-8", "surrogateescape"))
            self.path = folder / f"{digest.hexdigest()[:24]}.jsonl"
        self.source = source
        self._done: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()
        self._file: TextIO | None = None

    def load(self) -> None:
        """Read what an earlier run of the same source completed."""
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (FileNotFoundError, UnicodeDecodeError):
            return
        if not lines or _parse(lines[0]).get("source") != self.source:
            return
        for line in lines[1:]:
            entry = _parse(line)  # a torn last line (killed mid-write) parses as {}
            if {"rel", "size", "etag"} <= entry.keys():
                self._done[entry["rel"]] = (entry["size"], entry["etag"])

    def is_complete(self, rel: str, size: int, etag: str, final: Path) -> bool:
        if self._done.get(rel) != (size, etag):
            return False
        try:
            return final.stat().st_size == size
        except OSError:
            return False

    def open(self) -> None:
        """Start writing: rewrite the header and the entries still valid."""
        if self.private:
            folders(self.path.parent)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        mode = FILE_MODE if self.private else 0o666  # 0666: the umask decides
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(json.dumps({"source": self.source}) + "\n")
            for rel, (size, etag) in self._done.items():
                out.write(json.dumps({"rel": rel, "size": size, "etag": etag}) + "\n")
        os.replace(tmp, self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def record(self, rel: str, size: int, etag: str) -> None:
        self.record_many([(rel, size, etag)])

    def record_many(self, entries: list[tuple[str, int, str]]) -> None:
        """Record complete files ((rel, size, etag) each) with one write."""
        text = "".join([_LINE % (_quote(rel), size, _quote(etag)) for rel, size, etag in entries])
        with self._lock:
            for rel, size, etag in entries:
                self._done[rel] = (size, etag)
            if self._file is not None and text:
                self._file.write(text)
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None


def _parse(line: str) -> dict:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
