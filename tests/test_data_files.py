"""FileDataset: the listing order, (relative path, bytes) items, and that
`import datamount.data` never imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from datamount.data import FileDataset, list_files

pytestmark = pytest.mark.unit


def test_listing_order_and_items(tmp_path: Path) -> None:
    files = {
        "b.txt": b"b",
        "a/z.bin": b"\x00z",
        "a-b": b"dash",
        "a.txt": b"dot",
        "a/sub/deep.bin": b"deep" * 1000,
        ".hidden": b"skipped",
        ".git/config": b"skipped",
        "empty": b"",
    }
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body)
    (tmp_path / "link").symlink_to(tmp_path / "b.txt")
    (tmp_path / "dirlink").symlink_to(tmp_path / "a", target_is_directory=True)

    ds = FileDataset(tmp_path)
    # component by component: the folder "a" sorts before "a-b" and "a.txt"
    expected = ["a/sub/deep.bin", "a/z.bin", "a-b", "a.txt", "b.txt", "empty", "link"]
    assert ds.paths == expected == list_files(tmp_path)
    assert len(ds) == 7
    for i, name in enumerate(expected):
        path, body = ds[i]
        assert path == name
        assert body == (files.get(name) if name != "link" else b"b")
    assert ds[-1] == ("link", b"b")
    with pytest.raises(IndexError):
        ds[7]


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(NotADirectoryError):
        FileDataset(tmp_path / "missing")


def test_importing_imports_torch_only_where_it_is_installed() -> None:
    """The datasets are torch datasets where torch is installed (DataLoader
    tells an IterableDataset by isinstance), plain classes elsewhere; the
    daemon side never imports them (test_data_hints.py)."""
    import importlib.util

    code = (
        "import sys, datamount.data as d; d.FileDataset; d.RecordDataset; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(importlib.util.find_spec("torch") is not None)
