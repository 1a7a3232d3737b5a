"""`FileDataset`: map-style access to the files of a folder (a mounted or
downloaded input), and the listing order every dataset here shares.

Listing order: every regular file under the root (symbolic links to files
count, links to folders are not followed), sorted by its relative path
compared component by component in code-point order, so `a/z` comes before
`a-b` and `a.txt`, and the order never depends on the filesystem's listing
order. Names starting with "." are skipped (".amlignore", editor files).
No threads; `__getitem__` reads one whole file, so DataLoader workers read
in parallel. `hint(indices)` tells a datamount mount a shuffled order ahead
(data/hints.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from datamount.data import hints
from datamount.data.torchbase import MapBase


def list_files(root: str | os.PathLike[str]) -> list[str]:
    """The relative POSIX paths of the files under `root`, in listing order."""
    base = Path(root)
    if not base.is_dir():
        raise NotADirectoryError(f"{base}: not a folder")
    found: list[tuple[str, ...]] = []
    for folder, dirs, names in os.walk(base):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        rel = Path(folder).relative_to(base).parts
        for name in names:
            if not name.startswith(".") and os.path.isfile(os.path.join(folder, name)):
                found.append((*rel, name))
    return ["/".join(parts) for parts in sorted(found)]


class FileDataset(MapBase):
    """`len(ds)` files; `ds[i] -> (relative path, bytes)` in listing order.

    The listing is taken once, at construction (a mount's files do not
    change under it). Negative indices count from the end, as for a list.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.paths = list_files(self.root)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[str, bytes]:
        path = self.paths[index]  # IndexError past the end, as for a list
        return path, (self.root / path).read_bytes()

    def hint(self, indices: Iterable[int], *, replace: bool = True) -> bool:
        """Tell the datamount daemon serving the root (if any) that the files
        of `indices` are read next, in that order (a sampler's order), so it
        fetches them ahead: `files.hint(list(sampler))` at the start of an
        epoch. Listing order needs no hint. False when the root is not in a
        datamount mount (nothing sent)."""
        return hints.hint(self.root, [self.paths[i] for i in indices], replace=replace)

    def __repr__(self) -> str:
        return f"FileDataset({str(self.root)!r}, {len(self.paths)} files)"
