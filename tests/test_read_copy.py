"""read/copy.py: copy_into equals a slice assignment, below and above the
size where it hands the copy to numpy (which releases the GIL)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from datamount.read.copy import GIL_FREE_MIN, copy_into

pytestmark = pytest.mark.unit

SOURCE = random.Random(5).randbytes(3 * GIL_FREE_MIN + 17)


@pytest.mark.parametrize("size", [0, 1, GIL_FREE_MIN - 1, GIL_FREE_MIN, 3 * GIL_FREE_MIN + 17])
@pytest.mark.parametrize("kind", ["bytes", "readonly view", "numpy view"])
def test_copy_into_equals_the_source_slice(size: int, kind: str) -> None:
    data = SOURCE[:size]
    if kind == "readonly view":
        src = memoryview(bytearray(data)).toreadonly()
    elif kind == "numpy view":
        src = np.frombuffer(data, np.uint8).copy().data.toreadonly()
    else:
        src = data
    out = bytearray(b"\xee") * (size + 8)
    copy_into(memoryview(out)[4 : 4 + size], src)
    assert out[4 : 4 + size] == data
    assert out[:4] == out[4 + size :] == b"\xee" * 4  # nothing written outside dst


def test_copy_into_refuses_unequal_lengths() -> None:
    with pytest.raises(ValueError):
        copy_into(memoryview(bytearray(GIL_FREE_MIN)), SOURCE[: GIL_FREE_MIN + 1])
    with pytest.raises(ValueError):
        copy_into(memoryview(bytearray(10)), SOURCE[:11])
