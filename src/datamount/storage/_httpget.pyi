# The C module src/datamount/storage/_httpget.c (storage/nativeget.py is its Python face).
from collections.abc import Sequence
from typing import Any

from typing_extensions import Buffer

BODY: int
HEAD: int
TIMEOUT: int
CLOSED: int
SYSTEM: int
TLS: int
BAD_HEAD: int
BROKEN_BODY: int
NOT_TLS_OBJECT: int
DRAIN_MAX: int
HEAD_MAX: int
OPENSSL_VERSION_NUMBER: int

def get_into(
    sslobj: object | None,
    fd: int,
    request: Buffer,
    offset: int,
    length: int,
    buffers: Sequence[Buffer],
    timeout: float,
    /,
) -> tuple[int, int, int, int, Any]: ...
def read_body(
    sslobj: object | None, fd: int, buffers: Sequence[Buffer], count: int, timeout: float, /
) -> tuple[int, int, int, int, Any]: ...
