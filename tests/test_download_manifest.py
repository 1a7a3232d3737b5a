"""The resume manifest's lines (transfer.manifest): formatted without
json.dumps on the hot path, they are the bytes json.dumps gives, and load
reads them back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from datamount.transfer.manifest import MANIFEST_NAME, Manifest

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("rel", ["a/b.bin", 'na\u00efve "q" \\ \udcff\n', ""])
def test_manifest_lines_are_what_json_dumps_gives(tmp_path: Path, rel: str) -> None:
    # record_many formats its lines without json.dumps (one per file, on the hot path)
    manifest = Manifest(tmp_path, "src")
    manifest.open()
    manifest.record_many([(rel, 12, '"0x8D"'), ("z", 0, "")])
    manifest.close()
    lines = (tmp_path / MANIFEST_NAME).read_text(encoding="utf-8", errors="surrogateescape")
    expected = [
        json.dumps({"rel": rel, "size": 12, "etag": '"0x8D"'}),
        json.dumps({"rel": "z", "size": 0, "etag": ""}),
    ]
    assert lines.splitlines()[1:] == expected
    again = Manifest(tmp_path, "src")
    again.load()
    assert again._done == {rel: (12, '"0x8D"'), "z": (0, "")}
