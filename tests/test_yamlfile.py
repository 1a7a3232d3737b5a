"""datamount.yamlfile, the one reader of the CLI's YAML files: what it
returns and the exact line of each failure (the CLI's view is
tests/test_bad_files.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from datamount import yamlfile
from datamount.errors import SpecError

pytestmark = pytest.mark.unit


def load(path: Path, **kw: object) -> object:
    return yamlfile.load(path, f"f {path.name}", SpecError, **kw)  # type: ignore[arg-type]


def problem(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load(path)
    assert len(info.value.problems) == 1
    return info.value.problems[0]


def test_a_document_an_empty_file_and_a_bom(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_bytes(b"\xef\xbb\xbfa: [1, 2]\n")
    assert load(f) == {"a": [1, 2]}
    f.write_bytes(b"")
    assert load(f) is None


def test_a_missing_file(tmp_path: Path) -> None:
    assert load(tmp_path / "none.yaml", if_missing=lambda: "absent") == "absent"
    assert problem(tmp_path / "none.yaml") == "f none.yaml: cannot read it: no such file"


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"a: 1\nb: \"\x01\"\n", "not valid YAML (line 2, column 5): unacceptable character "
                                 "#x0001: special characters are not allowed"),
        (b"a: 2024-13-01\n", "not valid YAML: month must be in 1..12"),
        (b"[" * 2000, "not valid YAML: nested too deeply"),
        (b"a: 1\nb: \xff\n", "not a UTF-8 text file (byte 0xff at line 2, column 4)"),
        (b"a: !!python/object:os.system x\n",
         "not valid YAML (line 1, column 4): could not determine a constructor for the tag "
         "'tag:yaml.org,2002:python/object:os.system'"),
    ],
)  # fmt: skip
def test_one_line_per_failure(tmp_path: Path, data: bytes, line: str) -> None:
    f = tmp_path / "a.yaml"
    f.write_bytes(data)
    assert problem(f) == f"f a.yaml: {line}"


def test_too_large(tmp_path: Path) -> None:
    f = tmp_path / "big.yaml"
    with f.open("wb") as out:
        out.truncate(yamlfile.MAX_BYTES + 1)
    assert problem(f) == "f big.yaml: too large for a YAML file (over 16 MiB)"
