"""The one errno funnel of the FUSE layers: what a failed callback answers
the kernel, and what it logs.

An OSError keeps its errno; any other exception is logged with its traceback
and becomes EIO, so the daemon never crashes on a bad request. Answers that
are not failures (ENOENT, EROFS...) are never logged; refusals (links,
special files, modes, sizes) log one WARNING per operation and errno, later
ones at DEBUG (a POSIX suite makes hundreds); anything else one WARNING.

With a metrics endpoint on, each callback's latency is measured here too
(`set_observer`).

Threads: any; the set of refusals already logged is only added to.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable

log = logging.getLogger("datamount.fuse")

# errnos that are answers, not failures: never logged
QUIET = {errno.ENOENT, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENODATA, errno.EEXIST,
         errno.ENOTEMPTY}  # fmt: skip
REFUSALS = {errno.EPERM, errno.EOPNOTSUPP, errno.EACCES, errno.EINVAL, errno.ENAMETOOLONG,
            errno.EFBIG}  # fmt: skip
_refused: set[tuple[str, int]] = set()


def errno_of(op: str, exc: BaseException) -> int:
    """The errno the kernel gets for `exc` raised by callback `op` (logged as above)."""
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        code = errno.errorcode.get(exc.errno, exc.errno)
        if exc.errno in REFUSALS and (op, exc.errno) in _refused:
            log.debug("%s: %s (errno %s)", op, exc, code)
        elif exc.errno in REFUSALS:
            _refused.add((op, exc.errno))
            log.warning("%s: %s (errno %s; further %s refusals at DEBUG)", op, exc, code, code)
        elif exc.errno not in QUIET:
            log.warning("%s: %s (errno %s)", op, exc, code)
        return exc.errno
    log.error("%s: unexpected %s, answering EIO", op, type(exc).__name__, exc_info=exc)
    return errno.EIO


# observe(operation, seconds) of every callback, set by the daemon only while
# a metrics endpoint is on (set_observer); None: nothing is timed.
observer: Callable[[str, float], None] | None = None


def set_observer(observe: Callable[[str, float], None] | None) -> None:
    global observer
    observer = observe
