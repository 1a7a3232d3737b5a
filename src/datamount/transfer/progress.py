"""Transfer progress: thread-safe counters, and a reporter thread that draws a
bar on a terminal or writes a line every few seconds otherwise.

The CLI decides the stream; transfers only bump counters. One daemon thread
per running transfer. With `metrics=(host, port)` (DATAMOUNT_METRICS_HOST and
_PORT) the counters are also served as Prometheus metrics while the transfer
runs (datamount.metrics; prometheus-client's server thread reads `counts()`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, TextIO

log = logging.getLogger("datamount.transfer")

TTY_INTERVAL = 0.5
LINE_INTERVAL = 10.0  # seconds between plain progress lines (logs, CI output)


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class Progress:
    """Counters of one transfer. `total_*` grow while the listing streams."""

    def __init__(
        self,
        verb: str,
        stream: TextIO | None = None,
        *,
        tty: bool = False,
        metrics: tuple[str, int] | None = None,
    ) -> None:
        self.verb = verb
        self.metrics = metrics
        self.metrics_url = ""
        self._endpoint: Any = None
        self.stream = stream
        self.tty = tty
        self.started = time.monotonic()
        self.total_files = 0
        self.total_bytes = 0
        self.listing_done = False
        self.files = 0
        self.bytes = 0
        self.skipped_files = 0
        self.skipped_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- counters (any thread) ---------------------------------------------

    def planned(self, files: int, nbytes: int) -> None:
        with self._lock:
            self.total_files += files
            self.total_bytes += nbytes

    def skipped(self, files: int, nbytes: int) -> None:
        with self._lock:
            self.skipped_files += files
            self.skipped_bytes += nbytes

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes += n

    def file_done(self) -> None:
        with self._lock:
            self.files += 1

    def unbytes(self, n: int) -> None:
        """Take back bytes of a file that restarts (its blob changed)."""
        self.add_bytes(-n)

    # -- reporting -------------------------------------------------------

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                "bytes": self.bytes,
                "files": self.files,
                "total_bytes": self.total_bytes,
                "total_files": self.total_files,
                "skipped_bytes": self.skipped_bytes,
                "skipped_files": self.skipped_files,
            }

    def __enter__(self) -> Progress:
        if self.metrics is not None:
            self._serve_metrics(*self.metrics)
        if self.stream is not None:
            self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
            self._thread.start()
        return self

    def _serve_metrics(self, host: str, port: int) -> None:
        from datamount import metrics  # prometheus-client: only when metrics are on

        endpoint = metrics.Endpoint()
        endpoint.add(metrics.TransferCollector(self.verb, self.counts))
        self.metrics_url = endpoint.start(host, port)  # DataError when the port is taken
        self._endpoint = endpoint
        log.info("%s metrics at %s", self.verb, self.metrics_url)
        if self.stream is not None:
            self.stream.write(f"datamount: {self.verb} metrics at {self.metrics_url}\n")
            self.stream.flush()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._endpoint is not None:
            self._endpoint.stop()
            self._endpoint = None
        if self._thread is not None:
            self._thread.join()
        if self.stream is not None and self.tty:
            self.stream.write("\r" + self.line() + "\n")
            self.stream.flush()

    def _run(self) -> None:
        interval = TTY_INTERVAL if self.tty else LINE_INTERVAL
        while not self._stop.wait(interval):
            text = self.line()
            log.info("progress: %s", text)
            assert self.stream is not None
            self.stream.write(("\r\x1b[K" + text) if self.tty else (text + "\n"))
            self.stream.flush()

    def line(self) -> str:
        with self._lock:
            elapsed = max(time.monotonic() - self.started, 1e-6)
            rate = self.bytes / elapsed
            todo = self.total_bytes - self.skipped_bytes
            files_todo = self.total_files - self.skipped_files
            pct = f"{100 * self.bytes / todo:5.1f}% " if todo and self.listing_done else ""
            eta = ""
            if self.listing_done and rate > 0 and todo > self.bytes:
                eta = f", ETA {int((todo - self.bytes) / rate)}s"
            more = "" if self.listing_done else "+ (listing)"
            return (
                f"{self.verb}: {pct}{human(self.bytes)}/{human(todo)}{more}, "
                f"{self.files}/{files_todo} files, {human(rate)}/s{eta}"
            )
