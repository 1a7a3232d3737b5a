"""`RecordDataset`: an iterable dataset over the records of files or an
MLTable, sharded by node and loader worker, shuffled per epoch, and
resumable at the exact record.

Order of one epoch, for shard s of S (S = world_size x loader workers,
s = rank x workers + worker id):
1. the units (files, sources.py) in their listing order, shuffled (when
   `shuffle`) by random.Random(f"{seed}:{epoch}:files"): the same order on
   every rank and worker;
2. with at least S units, shard s reads units s, s+S, s+2S, ... of that order
   (shards may differ by a file's records); with fewer, every shard reads
   every unit and keeps the records whose index in the whole stream is s mod S;
3. when `shuffle`, a buffer shuffle of `buffer_size` records (default 1,000,
   as Hugging Face's): a full buffer yields a random slot and refills it, the
   last records drain in random order; its generator is seeded
   f"{seed}:{epoch}:{s}:{S}".

The position is the unit and the record in it the source has reached, the
records in the buffer and the generator's state: `state_dict()` holds them
all (the buffer's records too, so it is picklable for torch.save, and JSON
when the records are), and a dataset given it by `load_state_dict()` yields
exactly what the saved one had not yet yielded, re-reading only the records
of the current unit before the position. One live iterator per dataset
object (a DataLoader worker has its own copy). No threads.

Inside a datamount mount, each epoch starts by telling the daemon the files
it reads, in that order (`_hint`; data/hints.py): the daemon fetches them
ahead. Elsewhere nothing is sent.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from datamount.data import hints
from datamount.data.sources import Record, Unit, fingerprint, units_of
from datamount.data.torchbase import IterableBase, loader_worker
from datamount.errors import DataError, InvalidInput
from datamount.mltable import readers

DEFAULT_BUFFER_SIZE = 1000
STATE_FORMAT = 1
_END = object()


@dataclass(frozen=True)
class Progress:
    """Where this shard is in its epoch: records yielded, units (files) and
    their bytes the source has finished, out of the shard's total."""

    epoch: int
    records: int
    files_read: int
    files_total: int
    bytes_read: int
    bytes_total: int

    @property
    def fraction(self) -> float:
        return 1.0 if self.bytes_total == 0 else self.bytes_read / self.bytes_total


@dataclass
class _Position:
    epoch: int
    shard: tuple[int, int]
    rng: random.Random
    file_pos: int = 0  # index into the shard's unit order
    row: int = 0  # records the source has taken from that unit
    offset: int = 0  # records of the whole stream before that unit (stride mode)
    yielded: int = 0
    buffer: list[Record] = field(default_factory=list)


def _env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(f"{name}={text!r}: not an integer") from None


class RecordDataset(IterableBase):
    """Records (one dict each) of `root`: see the module docstring for the order.

    `rank` / `world_size` default to $RANK / $WORLD_SIZE (0 / 1 when unset),
    as torchrun and Azure ML set them; `environ` replaces os.environ for that.
    `epochs`: epochs one `iter()` runs through (None: forever); each finished
    epoch moves the dataset to the next one. `set_epoch(n)` moves to the start
    of epoch n, unless the dataset is already in epoch n (a restored position
    is kept).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        seed: int = 0,
        shuffle: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        epochs: int | None = 1,
        environ: Mapping[str, str] | None = None,
        block_size: int = readers.BLOCK_SIZE,
    ) -> None:
        env = os.environ if environ is None else environ
        self.rank = _env_int(env, "RANK", 0) if rank is None else rank
        self.world_size = _env_int(env, "WORLD_SIZE", 1) if world_size is None else world_size
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise InvalidInput(f"rank {self.rank} of world size {self.world_size}: out of range")
        if buffer_size < 1:
            raise InvalidInput(f"buffer_size {buffer_size}: must be >= 1")
        if epochs is not None and epochs < 1:
            raise InvalidInput(f"epochs {epochs}: must be >= 1 (None: forever)")
        self.root = root
        self.seed, self.shuffle, self.buffer_size, self.epochs = seed, shuffle, buffer_size, epochs
        self.units: list[Unit] = units_of(root, block_size)
        self.fingerprint = fingerprint(self.units)
        # A folder of record files: its units are its files, by relative path.
        folder = "://" not in os.fspath(root) and os.path.isdir(root)
        mltable = folder and os.path.exists(os.path.join(root, "MLTable"))
        self._hint_root = os.fspath(root) if folder and not mltable else ""
        self._epoch = 0
        self._pos: _Position | None = None  # None: the start of self._epoch

    # -- epochs and shards --------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._epoch, self._pos = epoch, None

    def shard(self) -> tuple[int, int]:
        """(s, S) of the process and loader worker this runs in."""
        worker, workers = loader_worker()
        return self.rank * workers + worker, self.world_size * workers

    def order(self, epoch: int, shard: tuple[int, int]) -> tuple[list[int], bool]:
        """The unit indices shard reads in `epoch`, and whether it strides records."""
        s, count = shard
        units = list(range(len(self.units)))
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}:files").shuffle(units)
        if len(units) >= count:
            return units[s::count], False
        return units, True

    def _fresh(self, epoch: int, shard: tuple[int, int]) -> _Position:
        return _Position(epoch, shard, random.Random(f"{self.seed}:{epoch}:{shard[0]}:{shard[1]}"))

    # -- iteration ----------------------------------------------------------

    def __iter__(self) -> Iterator[Record]:
        shard = self.shard()
        if self._pos is not None and self._pos.shard != shard:
            raise ValueError(
                f"the position was saved by shard {self._pos.shard[0]} of {self._pos.shard[1]}, "
                f"this is shard {shard[0]} of {shard[1]} (same rank, world size and workers)"
            )
        done = 0
        while self.epochs is None or done < self.epochs:
            if self._pos is None:
                self._pos = self._fresh(self._epoch, shard)
            yield from self._run(self._pos)
            done += 1
            self._epoch, self._pos = self._epoch + 1, None

    def _hint(self, pos: _Position) -> None:
        """When the root is a folder inside a datamount mount, tell its daemon
        the files this rank reads next, in order (data/hints.py): loader
        worker 0 sends the files of every worker of this rank, interleaved
        as the loader takes them (worker w's i-th file after worker w-1's)."""
        if not self._hint_root:
            return
        worker, workers = loader_worker()
        if worker != 0:
            return
        s0 = pos.shard[0] - pos.shard[0] % workers  # this rank's worker 0
        orders = [self.order(pos.epoch, (s0 + w, pos.shard[1]))[0] for w in range(workers)]
        if self.order(pos.epoch, pos.shard)[1]:  # stride mode: every shard reads every unit
            orders = orders[:1]
        ahead = [o[pos.file_pos :] for o in orders]
        names = [self.units[o[i]].name for i in range(max(map(len, ahead))) for o in ahead
                 if i < len(o)]  # fmt: skip
        hints.hint(self._hint_root, names, replace=True)

    def _run(self, pos: _Position) -> Iterator[Record]:
        s, count = pos.shard
        order, stride = self.order(pos.epoch, pos.shard)
        self._hint(pos)
        buf, rng = pos.buffer, pos.rng
        source: Iterator[Record] | None = None
        try:
            while True:
                record: Any = _END
                while pos.file_pos < len(order):
                    unit = self.units[order[pos.file_pos]]
                    if source is None:
                        source = self._open(unit, pos.row)
                    item = next(source, _END)
                    if item is _END:
                        source = None
                        pos.file_pos, pos.offset, pos.row = (
                            pos.file_pos + 1,
                            pos.offset + pos.row,
                            0,
                        )
                        continue
                    index = pos.offset + pos.row
                    pos.row += 1
                    if stride and index % count != s:
                        continue
                    record = item
                    break
                if record is _END:  # the source is done: drain the buffer at random
                    if not buf:
                        return
                    j = rng.randrange(len(buf))
                    buf[j], buf[-1] = buf[-1], buf[j]
                    out = buf.pop()
                elif not self.shuffle:
                    out = record
                elif len(buf) < self.buffer_size:
                    buf.append(record)
                    continue
                else:
                    j = rng.randrange(len(buf))
                    out, buf[j] = buf[j], record
                pos.yielded += 1
                yield out
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    @staticmethod
    def _open(unit: Unit, skip: int) -> Iterator[Record]:
        source = unit.read()
        for _ in range(skip):
            if next(source, _END) is _END:
                raise DataError(f"{unit.name}: has fewer records than when the position was saved")
        return source

    # -- progress and state ---------------------------------------------------

    def progress(self) -> Progress:
        pos = self._pos or self._fresh(self._epoch, self.shard())
        order, _ = self.order(pos.epoch, pos.shard)
        sizes = [self.units[i].size for i in order]
        return Progress(
            pos.epoch, pos.yielded, pos.file_pos, len(order), sum(sizes[: pos.file_pos]), sum(sizes)
        )

    def state_dict(self) -> dict[str, Any]:
        """The exact position (plain types; the buffered records as they are)."""
        state: dict[str, Any] = {
            "format": STATE_FORMAT,
            "fingerprint": self.fingerprint,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "buffer_size": self.buffer_size,
            "epoch": self._epoch,
            "position": None,
        }
        pos = self._pos
        if pos is not None:
            version, internal, gauss = pos.rng.getstate()
            state["position"] = {
                "shard": list(pos.shard),
                "file_pos": pos.file_pos,
                "row": pos.row,
                "offset": pos.offset,
                "yielded": pos.yielded,
                "buffer": list(pos.buffer),
                "rng": [version, list(internal), gauss],
            }
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state` (from a RecordDataset with the same arguments
        over the same data); the next iteration resumes there."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a RecordDataset state (format {state.get('format')!r})")
        for key in ("fingerprint", "seed", "shuffle", "buffer_size"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"the state was saved with {key}={state[key]!r}, this dataset has "
                    f"{getattr(self, key)!r}"
                )
        self._epoch = int(state["epoch"])
        saved = state["position"]
        if saved is None:
            self._pos = None
            return
        rng = random.Random()
        version, internal, gauss = saved["rng"]
        rng.setstate((version, tuple(internal), gauss))
        self._pos = _Position(
            self._epoch,
            (int(saved["shard"][0]), int(saved["shard"][1])),
            rng,
            file_pos=int(saved["file_pos"]),
            row=int(saved["row"]),
            offset=int(saved["offset"]),
            yielded=int(saved["yielded"]),
            buffer=list(saved["buffer"]),
        )

    def __repr__(self) -> str:
        return (
            f"RecordDataset({os.fspath(self.root)!r}, {len(self.units)} files, "
            f"rank {self.rank} of {self.world_size}, epoch {self._epoch})"
        )
