"""torch for real over a real ro_mount of Azurite: DataLoader workers and
torchrun ranks.

- `RecordDataset` under `DataLoader(num_workers=4)`: every record once per
  epoch, the order a function of the seed and the epoch, the same with
  `persistent_workers=True` (the workers' copies move to the next epoch
  themselves);
- torchdata's `StatefulDataLoader` saves the loader with its workers' dataset
  states mid-epoch (it calls `RecordDataset.state_dict()` in each worker) and a
  new loader given that state yields exactly the rest;
- `FileDataset` under workers, and a shuffled sampler resumed the same way;
- `torchrun --nproc_per_node=4` (gloo on CPU): four ranks share one mount, the
  union of their reads is the dataset once, and a rank killed with SIGKILL
  (torchrun restarts the group) resumes from its checkpoint without a
  duplicate.
"""

from __future__ import annotations

import os
import pickle
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from datamount.data import FileDataset, RecordDataset
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file, wait_for

torch = pytest.importorskip("torch")
torch_data = pytest.importorskip("torch.utils.data")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

pytestmark = [
    pytest.mark.azurite,
    pytest.mark.fuse,
    # 4 loader workers on a 2-core machine: torch's advice, not a problem here.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

FILES, ROWS = 12, 50
IDS = sorted(f * 1000 + i for f in range(FILES) for i in range(ROWS))


@pytest.fixture
def mounted_data(azurite, container, tmp_path: Path, mounts: Mounts) -> Iterator[tuple[Path, dict]]:  # noqa: ANN001
    """A ro_mount of 12 CSV files (600 records) under csv/ and 40 binary files under bin/."""
    rng = random.Random(29)
    blobs: dict[str, bytes] = {}
    for f in range(FILES):
        rows = "".join(f"{f * 1000 + i},{rng.random()}\n" for i in range(ROWS))
        blobs[f"ds/csv/part-{f:02}.csv"] = ("id,x\n" + rows).encode()
    for i in range(40):
        blobs[f"ds/bin/{i:02}.bin"] = rng.randbytes(rng.randrange(1, 200_000))
    azurite.seed(container, blobs)
    env = mount_env(azurite, tmp_path, container.container_name)
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/ds/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    try:
        yield mp, {k.removeprefix("ds/"): v for k, v in blobs.items()}
    finally:
        out = datamount("unmount", str(mp), env=env)
        assert out.returncode == 0, out.stderr
        assert wait_for(lambda: not mounted(mp))


def records(root: Path, **kwargs: object) -> RecordDataset:
    return RecordDataset(root, seed=5, shuffle=True, rank=0, world_size=1, buffer_size=32, **kwargs)


def ids(loader: object) -> list[int]:
    return [int(r["id"]) for r in loader]  # type: ignore[attr-defined]


def test_loader_workers_read_every_record_once_in_the_seeds_order(mounted_data) -> None:  # noqa: ANN001
    mp, _ = mounted_data
    ds = records(mp / "csv")
    epoch0 = ids(torch_data.DataLoader(ds, batch_size=None, num_workers=4))
    assert sorted(epoch0) == IDS
    # The same seed gives the same order in a new loader over a new dataset.
    assert ids(torch_data.DataLoader(records(mp / "csv"), batch_size=None, num_workers=4)) == epoch0
    # Each worker reads its own shard: 3 of the 12 files.
    workers = [
        {i // 1000 for i in epoch0[w::4]} for w in range(4)
    ]  # in-order loading takes one record per worker in turn while all have records
    assert all(len(files) == 3 for files in workers)
    ds.set_epoch(1)
    epoch1 = ids(torch_data.DataLoader(ds, batch_size=None, num_workers=4))
    assert sorted(epoch1) == IDS and epoch1 != epoch0

    # persistent_workers: the workers keep their dataset copies, which move to
    # the next epoch when one ends: the same two epochs.
    loader = torch_data.DataLoader(
        records(mp / "csv"), batch_size=None, num_workers=4, persistent_workers=True
    )
    assert [ids(loader), ids(loader)] == [epoch0, epoch1]


def test_stateful_loader_resumes_mid_epoch_with_its_workers_states(mounted_data) -> None:  # noqa: ANN001
    mp, _ = mounted_data
    whole = ids(torch_data.DataLoader(records(mp / "csv"), batch_size=None, num_workers=4))
    loader = stateful.StatefulDataLoader(records(mp / "csv"), batch_size=None, num_workers=4)
    it = iter(loader)
    first = [int(next(it)["id"]) for _ in range(137)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))  # what torch.save keeps
    del it, loader

    again = stateful.StatefulDataLoader(records(mp / "csv"), batch_size=None, num_workers=4)
    again.load_state_dict(state)
    rest = ids(again)
    assert first + rest == whole
    assert len(rest) == len(IDS) - 137


def test_file_dataset_under_workers_and_a_resumed_shuffled_sampler(mounted_data) -> None:  # noqa: ANN001
    mp, blobs = mounted_data
    files = FileDataset(mp / "bin")
    loader = torch_data.DataLoader(files, batch_size=8, num_workers=4, collate_fn=list)
    got = [item for batch in loader for item in batch]
    assert [name for name, _ in got] == files.paths
    assert all(body == blobs[f"bin/{name}"] for name, body in got)

    def shuffled() -> object:
        return stateful.StatefulDataLoader(
            files, batch_size=4, shuffle=True, num_workers=4, collate_fn=list,
            generator=torch.Generator().manual_seed(3),
        )  # fmt: skip

    whole = [name for batch in shuffled() for name, _ in batch]  # type: ignore[attr-defined]
    assert sorted(whole) == files.paths and whole != files.paths
    loader = shuffled()
    it = iter(loader)  # type: ignore[call-overload]
    first = [name for _ in range(3) for name, _ in next(it)]
    state = loader.state_dict()  # type: ignore[attr-defined]
    again = shuffled()
    again.load_state_dict(state)  # type: ignore[attr-defined]
    rest = [name for batch in again for name, _ in batch]  # type: ignore[attr-defined]
    assert first + rest == whole


RANK_SCRIPT = """
import os, pickle, signal, sys
import torch, torch.distributed as dist
from datamount.data import RecordDataset

root, out = sys.argv[1], sys.argv[2]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# A store prefix per attempt: with the default one, a restarted group's gloo
# mesh dialled the dead attempt's addresses (torch 2.13.0) and failed.
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, False)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                        rank=rank, world_size=world)
ckpt = os.path.join(out, f"rank{rank}.ckpt")
ds = RecordDataset(root, seed=11, shuffle=True, buffer_size=16)  # RANK, WORLD_SIZE from torchrun
seen = []
if os.path.exists(ckpt):
    with open(ckpt, "rb") as f:
        saved = pickle.load(f)
    ds.load_state_dict(saved["state"])
    seen = saved["seen"]
for record in ds:
    seen.append(int(record["id"]))
    if len(seen) % 5 == 0:  # the checkpoint: the dataset's position with what was consumed
        with open(ckpt + ".tmp", "wb") as f:
            pickle.dump({"state": ds.state_dict(), "seen": seen}, f)
        os.replace(ckpt + ".tmp", ckpt)
    if rank == 2 and attempt == 0 and len(seen) == 23:
        os.kill(os.getpid(), signal.SIGKILL)
total = torch.tensor([len(seen)])
dist.all_reduce(total)
with open(os.path.join(out, f"done{rank}.pkl"), "wb") as f:
    pickle.dump({"seen": seen, "attempt": attempt, "world": world,
                 "local_rank": int(os.environ["LOCAL_RANK"]), "total": int(total)}, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_ranks_share_a_mount_and_a_killed_rank_resumes(
    mounted_data, tmp_path: Path
) -> None:  # noqa: ANN001
    mp, _ = mounted_data
    script, out = tmp_path / "train.py", tmp_path / "out"
    script.write_text(RANK_SCRIPT)
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
         "--max-restarts=1", str(script), str(mp / "csv"), str(out)],
        env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    done = []
    for rank in range(4):
        with open(out / f"done{rank}.pkl", "rb") as f:
            done.append(pickle.load(f))
    # rank 2 died once: torchrun restarted the whole group, every rank resumed.
    assert [d["attempt"] for d in done] == [1, 1, 1, 1]
    assert [(d["world"], d["local_rank"]) for d in done] == [(4, r) for r in range(4)]
    assert {d["total"] for d in done} == {len(IDS)}
    for rank, d in enumerate(done):
        # Exactly the shard an uninterrupted rank reads, in its order: no duplicate, no gap.
        alone = RecordDataset(mp / "csv", seed=11, shuffle=True, rank=rank, world_size=4,
                              buffer_size=16)  # fmt: skip
        assert d["seen"] == ids(alone)
    assert sorted(i for d in done for i in d["seen"]) == IDS


def test_hugging_face_streaming_split_by_node_over_the_mount(mounted_data) -> None:  # noqa: ANN001
    """`load_dataset(..., streaming=True)` over the mounted files, split over 4
    ranks with `split_dataset_by_node`: every record once across the ranks; a
    rank's `state_dict()` mid-stream resumes it exactly (datasets >= 2.18)."""
    datasets = pytest.importorskip("datasets")
    from datasets.distributed import split_dataset_by_node

    mp, _ = mounted_data
    files = sorted(str(p) for p in (mp / "csv").glob("*.csv"))

    def rank_stream(rank: int) -> object:
        stream = datasets.load_dataset("csv", data_files=files, split="train", streaming=True)
        return split_dataset_by_node(stream, rank=rank, world_size=4)

    shards = [[int(r["id"]) for r in rank_stream(rank)] for rank in range(4)]  # type: ignore[attr-defined]
    assert sorted(i for shard in shards for i in shard) == IDS
    assert all(len(shard) == 3 * ROWS for shard in shards)  # 12 files: 3 per rank

    stream = rank_stream(1)
    it = iter(stream)  # type: ignore[call-overload]
    first = [int(next(it)["id"]) for _ in range(70)]
    state = stream.state_dict()  # type: ignore[attr-defined]
    again = rank_stream(1)
    again.load_state_dict(state)  # type: ignore[attr-defined]
    assert first + [int(r["id"]) for r in again] == shards[1]  # type: ignore[attr-defined]
