"""The base classes that make datamount's datasets torch datasets when torch
is installed, without importing torch when it is not.

torch's DataLoader tells an iterable dataset from a map-style one by
`isinstance(dataset, torch.utils.data.IterableDataset)`, so the protocol alone
is not enough: with torch installed the datasets subclass torch's classes
(importing torch then, once); without it they subclass `object`. The loader
worker a dataset runs in comes from `torch.utils.data.get_worker_info()`, read
only when torch is already imported (a DataLoader worker always has it).
No threads.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any


def _torch_data() -> Any:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch.utils.data

    return torch.utils.data


_TORCH_DATA = _torch_data()

if _TORCH_DATA is not None:
    MapBase: type = _TORCH_DATA.Dataset
    IterableBase: type = _TORCH_DATA.IterableDataset
else:
    MapBase = object
    IterableBase = object


def loader_worker() -> tuple[int, int]:
    """(worker id, number of workers) of the DataLoader worker this runs in;
    (0, 1) in the main process or without torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0, 1
    info = torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))
