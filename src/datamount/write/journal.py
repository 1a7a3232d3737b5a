"""The staging journal of an rw_mount output, as others read it: its file
name and states, and what it says a mount left only staged.

One job: one meaning of "what is left" for the daemon that ends
(`writeback.WriteBack.leftovers`), for `unmount` after a daemon died
(`journal_leftovers`, read without the folder's lock: its owner is gone), and
for the message the user reads (`Leftovers.describe`).

- `closed` / `failed` entries: to upload; a new mount of the output with the
  same cache folder uploads them.
- `open` entries: still open for writing when the mount ended (a forced
  unmount, or a daemon that died). Their writer never closed them, so they may
  be incomplete: never uploaded automatically, kept for the user.
- `abandoned`: `open` files an earlier mount already named; not counted again.

Threads: none (pure functions and a frozen value).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

JOURNAL = "journal.json"
OPEN, CLOSED, FAILED = "open", "closed", "failed"
ABANDONED = "abandoned"  # open when a previous daemon died: kept, never uploaded


@dataclass(frozen=True)
class Leftovers:
    """What a mount leaves only staged, as (blob key, staged file) pairs:
    `to_upload` (closed, or its upload failed: a new mount of the output with
    the same cache folder uploads them) and `never_closed` (still open for
    writing when the mount ended: kept, never uploaded automatically)."""

    to_upload: tuple[tuple[str, str], ...] = ()
    never_closed: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.to_upload or self.never_closed)

    def keys(self) -> list[str]:
        return sorted(k for k, _ in (*self.to_upload, *self.never_closed))

    def to_json(self) -> dict[str, list[list[str]]]:
        return {"to_upload": [list(e) for e in self.to_upload],
                "never_closed": [list(e) for e in self.never_closed]}  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Leftovers:
        def pairs(name: str) -> tuple[tuple[str, str], ...]:
            items = data.get(name) or []
            assert isinstance(items, list)
            return tuple((str(e[0]), str(e[1])) for e in items if isinstance(e, list) and e[1:])

        old = data.get("unsaved") or []  # an older daemon: blob keys to upload
        legacy = tuple((str(k), "") for k in old) if isinstance(old, list) else ()
        return cls(pairs("to_upload") + legacy, pairs("never_closed"))

    def describe(self, staging: str = "") -> str:
        """One line for the user: what is where, and what happens to it."""
        parts = []
        if self.to_upload:
            where = f"kept in the staging folder {staging}" if staging else "kept in staging"
            parts.append(
                f"{len(self.to_upload)} files could not be uploaded ({where}; a new mount of "
                "this output with the same cache folder uploads them): "
                + ", ".join(k for k, _ in self.to_upload)
            )
        if self.never_closed:
            parts.append(
                f"{len(self.never_closed)} files were still open for writing (never closed) "
                "when the mount ended, so they may be incomplete: NOT uploaded, and not "
                "uploaded automatically by a later mount; their bytes are kept in: "
                + ", ".join(f"{k} -> {p}" for k, p in self.never_closed)
            )
        return "; ".join(parts)


def journal_leftovers(directory: Path) -> Leftovers:
    """What the journal of a staging folder says is only staged (the daemon
    that owned it is gone); older `abandoned` files were named before."""
    try:
        data = json.loads((directory / JOURNAL).read_text())
        entries = {str(k): v for k, v in data.get("entries", {}).items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError):
        return Leftovers()
    return classify(directory, entries)


def classify(directory: Path, entries: dict[str, dict[str, str]]) -> Leftovers:
    """Journal entries (staged file id -> key and state) by kind."""
    to_upload, never_closed = [], []
    for sid, entry in sorted(entries.items(), key=lambda e: str(e[1].get("key", ""))):
        pair = (str(entry.get("key", "?")), str(directory / f"{sid}.data"))
        if entry.get("state") in (CLOSED, FAILED):
            to_upload.append(pair)
        elif entry.get("state") == OPEN:
            never_closed.append(pair)
    return Leftovers(tuple(to_upload), tuple(never_closed))


def died_message(where: str, pid: int, staging: str) -> str:
    """For `unmount` of an rw_mount whose daemon died: what its journal still
    holds, or that writes in progress may be lost."""
    left = journal_leftovers(Path(staging)) if staging else Leftovers()
    died = f"{where}: the rw_mount daemon (pid {pid}) died before it was unmounted"
    if left:
        return f"{died}; the stale mount is cleared. {left.describe(staging)}"
    return (
        f"{died}; the stale mount is cleared. Files closed before it died were uploaded; "
        "writes in progress when it died (not yet closed or fsync'd) may be lost"
        + (f" (nothing is left in its staging folder {staging})" if staging else "")
    )
