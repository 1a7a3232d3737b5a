# The native module's interface (src/datamount/fs/_lowlevel.c).
from typing import Any

MAX_IO: int

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
    ) -> None: ...
    def loop(self) -> int: ...
    def exit(self) -> None: ...
    def counters(self) -> dict[str, int]: ...
    def forget(self, path: bytes) -> None: ...
