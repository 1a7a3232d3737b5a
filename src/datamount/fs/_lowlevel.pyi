# The native module's interface (src/datamount/fs/_lowlevel.c).
from typing import Any

MAX_IO: int
SET_ATTR_MODE: int
SET_ATTR_UID: int
SET_ATTR_GID: int
SET_ATTR_SIZE: int
SET_ATTR_TIMES: int

class Session:
    def __init__(
        self,
        ops: Any,
        mountpoint: str,
        options: str,
        *,
        timeout: float,
        attr_ttl: float,
        max_threads: int,
        writable: bool = False,
    ) -> None: ...
    def loop(self) -> int: ...
    def exit(self) -> None: ...
    def counters(self) -> dict[str, int]: ...
    def forget(self, path: bytes) -> None: ...
    def cached(self, path: bytes, blocks: Any) -> bool: ...
    def take_opens(self, timeout: float) -> list[bytes] | None: ...
