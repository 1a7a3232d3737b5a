"""The datasets under torch's DataLoader (skipped when torch is not
installed): map-style batches of files, and records sharded over loader
workers with every record exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

torch_data = pytest.importorskip("torch.utils.data")

from datamount.data import FileDataset, RecordDataset  # noqa: E402


def test_file_dataset_in_a_dataloader(tmp_path: Path) -> None:
    for i in range(10):
        (tmp_path / f"{i:02}.bin").write_bytes(bytes([i]) * (i + 1))
    ds = FileDataset(tmp_path)
    assert isinstance(ds, torch_data.Dataset)
    loader = torch_data.DataLoader(ds, batch_size=4, collate_fn=list)
    items = [item for batch in loader for item in batch]
    assert items == [(f"{i:02}.bin", bytes([i]) * (i + 1)) for i in range(10)]


@pytest.mark.parametrize("workers", [0, 2])
def test_record_dataset_over_loader_workers(tmp_path: Path, workers: int) -> None:
    for f in range(5):
        rows = "".join(f"{f * 10 + i}\n" for i in range(7))
        (tmp_path / f"{f}.csv").write_text("id\n" + rows)
    ds = RecordDataset(tmp_path, seed=3, shuffle=True, rank=0, world_size=1)
    assert isinstance(ds, torch_data.IterableDataset)
    loader = torch_data.DataLoader(ds, batch_size=None, num_workers=workers)
    got = sorted(int(r["id"]) for r in loader)
    assert got == sorted(f * 10 + i for f in range(5) for i in range(7))
