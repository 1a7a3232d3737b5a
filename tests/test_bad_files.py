"""Every kind of YAML file the CLI reads, made bad in every way a file can be
bad (random bytes, Latin-1 text, a folder, a FIFO, YAML with an indentation
or tab error, an empty file), given to the installed `datamount` script: each
is exit 2 with exactly one `datamount: error:` line on stderr naming the
file, and for a YAML error its line and column. Never a traceback, never a
hang (the FIFO is refused without being read; every run has a timeout).

The MLTable file is read by `mount` of an eval_mount input (its own test,
tier fuse: a regression could mount, so the `mounts` fixture unmounts it).
"""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fuse_helpers import EXE, Mounts

pytestmark = pytest.mark.slow

# 4096 bytes that are not UTF-8 (the seed is fixed: the test is the same every run)
RANDOM = random.Random(30).randbytes(4096)
LATIN1 = "name: café\n".encode("latin-1")
INDENT = b"a:\n  b: 1\n c: 2\n"  # line 3, column 2: a key less indented than its block
TAB = b"a:\n\tb: 1\n"  # line 2, column 1: a tab cannot start a token


def test_the_random_bytes_are_not_utf8() -> None:
    with pytest.raises(UnicodeDecodeError):
        RANDOM.decode("utf-8")


def _write(data: bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(data)


BAD: dict[str, tuple[Callable[[Path], None], str]] = {
    # variant: (how the file is made, what the error line says besides its name)
    "random-bytes": (_write(RANDOM), "not a UTF-8 text file (byte 0x"),
    "latin-1": (_write(LATIN1), "not a UTF-8 text file (byte 0xe9 at line 1, column 10)"),
    "folder": (lambda path: path.mkdir(), "is a folder, not a file"),
    "fifo": (lambda path: os.mkfifo(path), "not a regular file (a FIFO)"),
    "indentation": (_write(INDENT), "not valid YAML (line 3, column 2): expected <block end>"),
    "tab": (_write(TAB), "not valid YAML (line 2, column 1): found character '\\t'"),
    "empty": (_write(b""), ""),
}

SPEC = "inputs:\n  data: {type: uri_folder, path: ./data/}\n"
COMMAND = "$schema: https://azuremlschemas.azureedge.net/latest/commandComponent.schema.json\n"


def _site(tmp_path: Path, kind: str) -> tuple[list[str], str]:
    """The files around the bad one (tmp_path/'bad.yaml') for `kind`, and the argv."""
    ws = tmp_path / "ws.yaml"
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    ws.write_text("datastores: {}\n")
    if kind == "spec":
        return ["validate", "bad.yaml"], "bad.yaml"
    if kind == "data asset":
        return ["data", "create", "bad.yaml"], "bad.yaml"
    if kind == "component":
        return ["component", "create", "bad.yaml"], "bad.yaml"
    if kind == "workspace":
        return ["--workspace", "bad.yaml", "validate", "spec.yaml"], "workspace file bad.yaml"
    if kind == "asset registry":
        ws.write_text("datastores: {}\nregistry_file: bad.yaml\n")
        return ["--workspace", "ws.yaml", "validate", "spec.yaml"], "asset registry bad.yaml"
    if kind == "run history":
        (tmp_path / "ws.runs.yaml").symlink_to("bad.yaml")
        spec.write_text("inputs:\n  data: {type: uri_folder, path: azureml://jobs/r1/outputs/o}\n")
        return ["--workspace", "ws.yaml", "validate", "spec.yaml"], "run history ws.runs.yaml"
    pipeline = tmp_path / "pipeline.yaml"
    if kind == "step component":
        pipeline.write_text("type: pipeline\njobs:\n  s: {type: command, component: ./bad.yaml}\n")
        return ["validate", "pipeline.yaml"], f"jobs.s.component: {tmp_path}/bad.yaml"
    assert kind == "workspace component"
    ws.write_text("datastores: {}\ncomponents:\n  c: [{version: '1', path: bad.yaml}]\n")
    pipeline.write_text("type: pipeline\njobs:\n  s: {type: command, component: azureml:c:1}\n")
    return ["--workspace", "ws.yaml", "validate", "pipeline.yaml"], f"component file {tmp_path}/"


KINDS = ["spec", "data asset", "component", "workspace", "asset registry", "run history",
         "step component", "workspace component"]  # fmt: skip
# An empty asset registry is no registration yet, not an error.
CASES = [(k, v) for k in KINDS for v in BAD if (k, v) != ("asset registry", "empty")]


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAMOUNT_", "DATASET_"))}
    env["DATAMOUNT_CACHE_DIR"] = str(cwd / "cache")
    return subprocess.run([EXE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of an invalid input, checked: exit 2, no other line."""
    lines = result.stderr.splitlines()
    assert (result.returncode, len(lines)) == (2, 1), result.stderr
    assert lines[0].startswith("datamount: error: "), lines[0]
    assert "unexpected" not in lines[0] and "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize(("kind", "variant"), CASES)
def test_one_line_for_a_bad_file(tmp_path: Path, kind: str, variant: str) -> None:
    make, says = BAD[variant]
    args, names = _site(tmp_path, kind)
    make(tmp_path / "bad.yaml")
    line = one_line(cli(args, tmp_path))
    assert names in line and says in line, line
    if variant == "empty" and kind in ("spec", "data asset", "component", "step component"):
        assert line.endswith("expected a YAML mapping at the top level"), line


def test_empty_workspace_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "ws.yaml").write_bytes(b"")
    line = one_line(cli(["--workspace", "ws.yaml", "validate", "spec.yaml"], tmp_path))
    assert line == (
        "datamount: error: workspace file ws.yaml: empty; expected a mapping (datastores: ...)"
    )


def test_a_parser_message_is_folded_into_one_line(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "ws.yaml").write_bytes(INDENT)
    line = one_line(cli(["--workspace", "ws.yaml", "validate", "spec.yaml"], tmp_path))
    assert line == (
        "datamount: error: workspace file ws.yaml: not valid YAML (line 3, column 2): "
        "expected <block end>, but found '<block mapping start>' "
        "(while parsing a block mapping at line 1, column 1)"
    )


MLTABLE_CASES = [v for v in BAD if v != "fifo"]  # the local store would open a FIFO


@pytest.mark.fuse
@pytest.mark.parametrize("variant", MLTABLE_CASES)
def test_one_line_for_a_bad_mltable(tmp_path: Path, mounts: Mounts, variant: str) -> None:
    make, says = BAD[variant]
    (tmp_path / "table").mkdir()
    make(tmp_path / "table" / "MLTable")
    (tmp_path / "spec.yaml").write_text(
        "inputs:\n  t: {type: mltable, path: ./table/, mode: eval_mount}\n"
    )
    mountpoint = mounts.point(tmp_path / "mp")
    line = one_line(cli(["mount", "spec.yaml", str(mountpoint)], tmp_path))
    assert f"MLTable {tmp_path}/table/MLTable: " in line and says in line, line
    if variant == "empty":
        assert line.endswith(
            "expected a mapping with 'paths' and 'transformations' at the top level"
        )


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        (None, "download of {s}/no-such-spec.yaml failed: {s}/no-such-spec.yaml: no such folder"),
        ("{s}/folder", "{s}/folder: is a folder; declare the input as uri_folder"),
        ("{s}/absent.txt",
         "download of {s}/absent.txt failed: stat '{s}/absent.txt' failed: no such file"),
    ],
)  # fmt: skip
def test_a_local_path_is_named_with_its_leading_slash(
    tmp_path: Path, spec: str | None, error: str
) -> None:
    """A local store's keys drop the root's '/'; the lines name the path."""
    (tmp_path / "folder").mkdir()
    target = "no-such-spec.yaml"
    if spec is not None:
        target = "spec.yaml"
        path = spec.format(s=tmp_path)
        (tmp_path / target).write_text(f"inputs:\n  f: {{type: uri_file, path: {path}}}\n")
    result = cli(["download", target, "out"], tmp_path)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [f"datamount: error: {error.format(s=tmp_path)}"]
    assert not (tmp_path / "out").exists()
