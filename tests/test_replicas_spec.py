"""The `replicas:` key of an input (an extension of the spec), its resolution
by RANK, and `download --shard auto` over local folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from datamount.cli.main import main
from datamount.errors import SettingsError, SpecError
from datamount.jobspec.job import parse_spec
from datamount.modes.context import Context
from datamount.modes.download import Shard
from datamount.settings import Settings
from datamount.storage import store_for
from datamount.storage.replicas import ReplicaStore
from datamount.storage.retry import RetryPolicy

pytestmark = pytest.mark.unit

A, B, C = (f"azureml://datastores/{n}/paths/train/" for n in "abc")


def test_replicas_parse_as_locations() -> None:
    spec = parse_spec({"type": "uri_folder", "path": A, "replicas": [B, C]})
    entry = spec.entry(None)
    assert entry.replicas == (B, C)
    assert [loc.raw for loc in entry.replica_locations] == [B, C]
    assert "replica_locations" not in entry.model_dump()


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"type": "uri_folder", "path": A, "replicas": B}, "non-empty list"),
        ({"type": "uri_folder", "path": A, "replicas": []}, "non-empty list"),
        ({"type": "uri_folder", "path": A, "replicas": [A]}, "repeats a path"),
        ({"type": "uri_folder", "path": A, "replicas": ["wasbs://"]}, "replicas[0]"),
        ({"type": "uri_file", "path": A + "x.csv", "replicas": [B]}, "names a folder"),
        (
            {"type": "uri_folder", "path": A, "replicas": ["azureml:m:1"], "mode": "download"},
            None,
        ),
    ],
)
def test_bad_replicas_are_one_line_each(raw: dict, problem: str | None) -> None:
    if problem is None:
        parse_spec(raw)  # an asset reference: resolved (and checked) with the workspace
        return
    with pytest.raises(SpecError) as info:
        parse_spec(raw)
    assert any(problem in line and "replicas" in line for line in info.value.problems)


def test_outputs_cannot_have_replicas() -> None:
    with pytest.raises(SpecError, match="replicas are for inputs"):
        parse_spec({"outputs": {"o": {"type": "uri_folder", "path": A, "replicas": [B]}}})


def _tree(root: Path, n: int = 30) -> dict[str, bytes]:
    files = {f"d{i % 3}/f{i:03d}.txt": f"file {i}\n".encode() * (i + 1) for i in range(n)}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _context(tmp_path: Path, **env: str) -> Context:
    environ = {"DATAMOUNT_CACHE_DIR": str(tmp_path / "cache"), **env}
    return Context(Settings.from_env(environ), environ, tmp_path)


@pytest.mark.parametrize(("rank", "prefer"), [(0, 0), (1, 1), (2, 2), (5, 2)])
def test_each_rank_prefers_replica_rank_mod_n(tmp_path: Path, rank: int, prefer: int) -> None:
    for name in "abc":
        _tree(tmp_path / name, 3)
    spec = parse_spec(
        {"type": "uri_folder", "path": "./a/", "replicas": ["./b/", "./c/"]},
        source=tmp_path / "spec.yaml",
    )
    ctx = _context(tmp_path, RANK=str(rank))
    location = ctx.resolve(spec, spec.entry(None))
    assert [r.path for r in location.replicas] == [str(tmp_path / n) + "/" for n in "abc"]
    assert location.prefer == prefer
    store = store_for(ctx.settings, location, RetryPolicy())
    assert isinstance(store, ReplicaStore) and store.preferred == prefer
    store.close()
    # a location derived from it (an MLTable's files) reads the same copy
    child = store_for(ctx.settings, location.child("d0/f000.txt"), RetryPolicy())
    assert isinstance(child, ReplicaStore) and child.preferred == prefer
    info = child.stat(location.child("d0/f000.txt").key)
    assert info.key.endswith("/a/d0/f000.txt") and info.etag.startswith(f"r{prefer}:")
    child.close()


def test_a_bad_rank_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="RANK"):
        _context(tmp_path, RANK="first").rank()
    with pytest.raises(SettingsError, match="not below WORLD_SIZE"):
        Shard.from_context(_context(tmp_path, RANK="4", WORLD_SIZE="4"))


def test_download_shard_auto_splits_the_files_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _tree(tmp_path / "src")
    monkeypatch.setenv("DATAMOUNT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.chdir(tmp_path)  # no workspace file: local paths need none
    got: dict[str, bytes] = {}
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        dest = tmp_path / f"node{rank}"
        for _ in range(2):  # a rerun: the same files, skipped as complete
            assert (
                main(["download", str(tmp_path / "src") + "/", str(dest), "--shard", "auto"]) == 0
            )
        mine = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        assert mine and not set(mine) & set(got)
        assert all(Shard(rank, 3).holds(rel) for rel in mine)
        got.update(mine)
    assert got == files
