# The C module src/datamount/read/_buffers.c (read/copy.py is its Python face).
from collections.abc import Sequence

from typing_extensions import Buffer

GIL_FREE_MIN: int
PAGE: int

def empty(size: int, /) -> memoryview: ...
def copy_into(dst: Buffer, src: Buffer, /) -> None: ...
def address(buffer: Buffer, /) -> int: ...
def write_file(
    folder: str, direct: bool, pieces: Sequence[Buffer], root_fd: int, name: str, /
) -> int: ...
