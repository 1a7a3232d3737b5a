"""RecordDataset over real files (CSV, JSON lines, parquet, an MLTable) read
through the MLTable readers: sharding by rank, deterministic shuffles, epochs,
progress, and the exact-resumption property under hypothesis.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datamount.data import RecordDataset
from datamount.errors import InvalidInput

pytestmark = pytest.mark.unit

# file -> number of records; ids are unique over the whole folder
LAYOUT = {"a.csv": 7, "b/c.jsonl": 5, "b/d.parquet": 9, "e.csv": 1, "f.jsonl": 0, "g.tsv": 3}
TOTAL = sum(LAYOUT.values())


def write_folder(root: Path) -> list[int]:
    next_id = 0
    for name, count in LAYOUT.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        ids = list(range(next_id, next_id + count))
        next_id += count
        if name.endswith(".csv"):
            path.write_text("id,text\n" + "".join(f"{i},row {i}\n" for i in ids))
        elif name.endswith(".tsv"):
            path.write_text("id\ttext\n" + "".join(f"{i}\trow {i}\n" for i in ids))
        elif name.endswith(".jsonl"):
            path.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in ids))
        else:
            pq.write_table(
                pa.table({"id": ids, "text": [f"row {i}" for i in ids]}), path, row_group_size=4
            )
    (root / "README.md").write_text("not records: skipped")
    (root / ".hidden.csv").write_text("id\n999\n")
    return list(range(next_id))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("records")
    write_folder(root)
    return root


def ids(records: list[dict]) -> list[int]:
    return [int(r["id"]) for r in records]


def test_listing_order_without_shuffle(folder: Path) -> None:
    ds = RecordDataset(folder)
    assert [u.name for u in ds.units] == [
        "a.csv",
        "b/c.jsonl",
        "b/d.parquet",
        "e.csv",
        "f.jsonl",
        "g.tsv",
    ]
    records = list(ds)
    assert ids(records) == list(range(TOTAL))
    assert records[0] == {"id": 0, "text": "row 0"}


def test_a_single_file_and_an_mltable_folder(folder: Path, tmp_path: Path) -> None:
    assert ids(list(RecordDataset(folder / "b" / "d.parquet"))) == list(range(12, 21))
    table = tmp_path / "table"
    table.mkdir()
    (table / "x.csv").write_text("id;v\n1;a\n2;b\n")
    (table / "y.csv").write_text("id;v\n3;c\n")
    (table / "MLTable").write_text(
        "paths:\n  - pattern: ./*.csv\ntransformations:\n  - read_delimited:\n      delimiter: ';'\n"
    )
    assert list(RecordDataset(table)) == [
        {"id": 1, "v": "a"},
        {"id": 2, "v": "b"},
        {"id": 3, "v": "c"},
    ]
    assert ids(list(RecordDataset(table, rank=1, world_size=2))) == [3]
    # steps after the read step count rows over the whole table: read as one unit
    (table / "MLTable").write_text(
        "paths:\n  - pattern: ./*.csv\ntransformations:\n  - read_delimited:\n"
        "      delimiter: ';'\n  - skip: 1\n"
    )
    assert ids(list(RecordDataset(table))) == [2, 3]
    assert ids(list(RecordDataset(table, rank=0, world_size=2))) == [2]


def test_rank_and_world_size_default_from_the_environment(folder: Path) -> None:
    ds = RecordDataset(folder, environ={"RANK": "2", "WORLD_SIZE": "3"})
    assert (ds.rank, ds.world_size) == (2, 3)
    # 6 files >= 3 shards: shard 2 reads files 2 and 5 of the listing
    assert ids(list(ds)) == list(range(12, 21)) + [22, 23, 24]
    with pytest.raises(InvalidInput, match="RANK='x': not an integer"):
        RecordDataset(folder, environ={"RANK": "x"})
    with pytest.raises(InvalidInput, match="rank 3 of world size 3"):
        RecordDataset(folder, rank=3, world_size=3)
    with pytest.raises(InvalidInput, match="no such file or folder"):
        RecordDataset(folder / "missing")


def test_shuffle_is_deterministic_per_seed_and_epoch(folder: Path) -> None:
    def epoch_ids(seed: int, epoch: int) -> list[int]:
        ds = RecordDataset(folder, seed=seed, shuffle=True, buffer_size=4)
        ds.set_epoch(epoch)
        return ids(list(ds))

    first = epoch_ids(7, 0)
    assert sorted(first) == list(range(TOTAL)) and first != list(range(TOTAL))
    assert epoch_ids(7, 0) == first
    assert epoch_ids(7, 1) != first
    assert epoch_ids(8, 0) != first


def test_epochs_loop_and_progress(folder: Path) -> None:
    ds = RecordDataset(folder, seed=1, shuffle=True, epochs=2)
    it = iter(ds)
    assert ds.progress().records == 0
    seen = [next(it) for _ in range(TOTAL)]
    rest = list(it)
    assert len(rest) == TOTAL and sorted(ids(seen)) == sorted(ids(rest)) == list(range(TOTAL))
    assert ids(seen) != ids(rest)  # epoch 1 has its own order
    assert ds.epoch == 2
    one = RecordDataset(folder)
    it = iter(one)
    for _ in range(10):  # a.csv (7) and 3 of b/c.jsonl
        next(it)
    p = one.progress()
    assert (p.epoch, p.records, p.files_read, p.files_total) == (0, 10, 1, 6)
    assert p.bytes_total == sum(u.size for u in one.units)
    assert p.bytes_read == one.units[0].size and 0 < p.fraction < 1
    list(it)
    assert one.epoch == 1  # a finished epoch moves on: the next iteration is epoch 1


def test_a_finished_epoch_and_set_epoch(folder: Path) -> None:
    ds = RecordDataset(folder)
    list(ds)
    state = ds.state_dict()
    again = RecordDataset(folder)
    again.load_state_dict(state)
    again.set_epoch(1)  # the restored epoch: kept
    assert again.epoch == 1 and len(list(again)) == TOTAL
    again.set_epoch(0)
    assert len(list(again)) == TOTAL


def test_a_state_only_fits_its_dataset(folder: Path, tmp_path: Path) -> None:
    ds = RecordDataset(folder, rank=0, world_size=2)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    other = RecordDataset(folder, rank=1, world_size=2)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="saved by shard 0 of 2, this is shard 1 of 2"):
        next(iter(other))
    with pytest.raises(ValueError, match="seed"):
        RecordDataset(folder, seed=5, rank=0, world_size=2).load_state_dict(state)
    copy = tmp_path / "copy"
    write_folder(copy)
    (copy / "e.csv").write_text("id,text\n21,xx\n99,y\n")
    with pytest.raises(ValueError, match="fingerprint"):
        RecordDataset(copy, rank=0, world_size=2).load_state_dict(state)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    world=st.integers(1, 7),  # 6 files: up to 6 shards by file, 7 by record
    shuffle=st.booleans(),
    buffer_size=st.integers(1, 9),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 2),
    cuts=st.lists(st.lists(st.integers(0, TOTAL), max_size=3), min_size=7, max_size=7),
)
def test_a_restored_iterator_yields_exactly_what_was_left(
    folder: Path, world: int, shuffle: bool, buffer_size: int, seed: int, epoch: int, cuts: list
) -> None:
    def make(rank: int) -> RecordDataset:
        return RecordDataset(
            folder, seed=seed, shuffle=shuffle, rank=rank, world_size=world, buffer_size=buffer_size
        )

    union: list[int] = []
    for rank in range(world):
        reference = make(rank)
        reference.set_epoch(epoch)
        expected = ids(list(reference))
        ds = make(rank)
        ds.set_epoch(epoch)
        got: list[int] = []
        finished = False
        for cut in sorted(cuts[rank]):
            it = iter(ds)
            while not finished and len(got) < cut:
                record = next(it, None)
                finished = record is None
                if record is not None:
                    got.append(int(record["id"]))
            state = json.loads(json.dumps(ds.state_dict()))  # plain types: JSON round trip
            ds = make(rank)
            ds.load_state_dict(state)
            if finished:  # the epoch is over: the state is the start of the next one
                assert state["epoch"] == epoch + 1 and state["position"] is None
                break
            ds.set_epoch(epoch)  # the usual loop calls it again: the position is kept
            assert ds.progress().records == len(got)
        if not finished:
            got.extend(ids(list(ds)))
        assert got == expected  # no record twice, none missing, same order
        union.extend(got)
    assert sorted(union) == list(range(TOTAL))  # every record once per epoch across ranks


def test_row_dataset_is_random_access_over_the_same_records(folder: Path) -> None:
    from datamount.data import RowDataset

    rows = RowDataset(folder)
    assert len(rows) == TOTAL
    assert [rows[i] for i in range(TOTAL)] == list(RecordDataset(folder))
    assert rows[-1] == rows[TOTAL - 1]
    with pytest.raises(IndexError):
        rows[TOTAL]
