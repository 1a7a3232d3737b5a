"""An MLTable served over http (a folder URL, remote paths only), and the eval
layout: every evaluated file gets a path of its own, inside the layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from datamount.errors import DataError
from datamount.mltable import MLTableError, eval_relative_path, evaluate, load
from datamount.storage.location import StorageKind, StorageLocation
from datamount.workspace.datastores import Workspace
from mltable_support import Counts, counting_factory, http_folder

pytestmark = pytest.mark.unit

CSV = b"x\n1\n"
NO_WS = Workspace.empty()  # not the repository's ./configs/workspace.yaml


def site(root: Path, mltable: str) -> None:
    (root / "t").mkdir(parents=True, exist_ok=True)
    (root / "t" / "a.csv").write_bytes(CSV)
    (root / "t" / "MLTable").write_text(mltable)


def test_http_mltable_by_folder_url_or_file_url(tmp_path: Path) -> None:
    with http_folder(tmp_path) as base:
        site(
            tmp_path,
            f"paths:\n  - file: {base}t/a.csv\ntransformations:\n  - read_delimited: {{}}\n",
        )
        for uri in (f"{base}t/", f"{base}t/MLTable"):
            files = evaluate(uri, None, counting_factory(Counts()))
            assert [(f.location.kind, f.path, f.size) for f in files] == [
                (StorageKind.HTTP, f"{base}t/a.csv", 4)
            ]
            assert load(uri, NO_WS).to_pandas_dataframe()["x"].tolist() == [1]


def test_http_mltable_cannot_reference_local_files(tmp_path: Path) -> None:
    secret = tmp_path / "node" / "env.sh"
    secret.parent.mkdir()
    secret.write_text("export KEY=hunter2\n")
    served = tmp_path / "served"
    with http_folder(served) as base:
        for entry in (f"file: {secret}", f"file: file://{secret}", f"folder: {secret.parent}/"):
            kind, value = entry.split(": ", 1)
            site(served, f"paths:\n  - {entry}\n")
            with pytest.raises(MLTableError) as info:
                evaluate(f"{base}t/", None, counting_factory(Counts()))
            assert str(info.value) == (
                f"MLTable {base}t/MLTable: paths[0].{kind}: {value!r}: "
                "a remote MLTable cannot reference local files"
            )
            with pytest.raises(MLTableError, match="a remote MLTable cannot reference local"):
                load(f"{base}t/", NO_WS).to_pandas_dataframe()


def test_two_files_on_one_eval_path_are_an_error(tmp_path: Path) -> None:
    with http_folder(tmp_path) as base:
        # Two URLs differing only in their query: both would be http/<host>/t/a.csv.
        site(tmp_path, f"paths:\n  - file: '{base}t/a.csv?v=1'\n  - file: '{base}t/a.csv?v=2'\n")
        with pytest.raises(DataError) as info:
            evaluate(f"{base}t/", None, counting_factory(Counts()))
        host = base.split("/")[2]
        assert str(info.value) == (
            f"MLTable {base}t/MLTable: paths[1]: {base}t/a.csv?v=2 and {base}t/a.csv?v=1 "
            f"(paths[0]) would both be 'http/{host}/t/a.csv' in the eval layout"
        )
        # load reads each URL as it is (no layout): both rows.
        (tmp_path / "t" / "MLTable").write_text(
            (tmp_path / "t" / "MLTable").read_text() + "transformations:\n  - read_delimited: {}\n"
        )
        assert load(f"{base}t/", NO_WS).to_pandas_dataframe()["x"].tolist() == [1, 1]
        # A '..' segment in a URL would point the layout's MLTable elsewhere.
        site(tmp_path, f"paths:\n  - file: '{base}t/sub/../a.csv'\n")
        with pytest.raises(DataError, match=r"paths\[0\]: .*/t/sub/\.\./a\.csv: '\.' and '\.\.'"):
            evaluate(f"{base}t/", None, counting_factory(Counts()))


def test_local_abs_file_and_relative_abs_folder_do_not_collide_silently(tmp_path: Path) -> None:
    outside = tmp_path / "x.csv"
    outside.write_bytes(CSV)
    table = tmp_path / "tbl"
    inside = table / "_abs" / str(outside).lstrip("/")  # local/_abs/<outside path> too
    inside.parent.mkdir(parents=True)
    inside.write_bytes(CSV)
    (table / "MLTable").write_text(
        f"paths:\n  - file: {outside}\n  - file: ./_abs/{inside.relative_to(table / '_abs')}\n"
    )
    with pytest.raises(
        DataError, match=r"paths\[1\]: .* \(paths\[0\]\) would both be 'local/_abs/"
    ):
        evaluate(str(table), None, counting_factory(Counts()))


def test_eval_path_of_a_local_file_under_an_mltable_at_the_root() -> None:
    root = StorageLocation(StorageKind.LOCAL, "/")
    assert eval_relative_path(StorageLocation(StorageKind.LOCAL, "/data/x.csv"), root) == (
        "local/data/x.csv"
    )
