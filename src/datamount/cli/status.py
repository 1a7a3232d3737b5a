"""`datamount status`: what datamount is serving on this node.

Reads what the other commands record under the cache folder — the state file
of every mount daemon (`<cache>/mounts/*.json`), its stats file, its
supervisor's record (restarts, and why it gave up: mount.supervise), and the
record of every upload output waiting for its `unmount`
(`<cache>/outputs/*.json`) — and checks each against the kernel's mount table
and the process table. Read-only: it never repairs anything (`mount` clears a
stale mount point, `unmount` ends a daemon).

`ready` (`status --ready MOUNTPOINT`, a container's startup/readiness probe)
asks the kernel and the daemon only: a datamount FUSE mount at that path whose
daemon answers a statfs and a directory listing, on a helper thread so a hung
daemon makes the probe fail after `timeout` instead of hanging it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from datamount.cli.parser import PROG
from datamount.errors import DatamountError
from datamount.modes import upload_records
from datamount.modes.context import Context
from datamount.mount import control
from datamount.mount.table import find_mount
from datamount.mountinfo import FSTYPE


@dataclass(frozen=True)
class Entry:
    mountpoint: str
    kind: str  # "mount" (a FUSE daemon) or "upload" (an upload output's folder)
    entry: str  # the spec entry (input or output name)
    state: str  # serving / restarting / stale / daemon gone / waiting for unmount
    pid: int | None = None
    uri: str = ""
    started: float | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    metrics_url: str = ""  # the daemon's Prometheus endpoint, "" when off
    rates: dict[str, float] = field(default_factory=dict)  # over the daemon's last interval
    verdict: str = ""  # what limits it now (mount.diagnose)
    restarts: int = 0  # times its daemon died and was started again in place

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mount_state(state: control.MountState, record: control.Supervision | None) -> str:
    point = Path(state.mountpoint)
    alive = control.alive(state.pid)
    if control.is_stale(point):
        if record is not None and record.gave_up:
            return (f"stale (daemon {record.last_death}; {record.gave_up}; "
                    "the next mount clears it)")  # fmt: skip
        if record is not None and control.alive(record.pid):
            return f"restarting (daemon {record.last_death or 'gone'})"
        return "stale (daemon gone; the next mount clears it)"
    if control.find_mount(point) is None:
        return "not mounted" + ("" if alive else " (daemon gone)")
    return "serving" if alive else "mounted, daemon gone"


def _stats_file(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _part(data: dict[str, Any], name: str) -> dict[str, Any]:
    part = data.get(name)
    return part if isinstance(part, dict) else {}


def _mount_entry(cache_dir: Path, path: Path) -> Entry | None:
    """The mount whose daemon wrote state file `path`, or None for another file."""
    if path.suffixes != [".json"]:
        return None  # beside a state file: <state>.unsaved.json, <state>.supervisor.json
    try:
        state = control.MountState(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    data = _stats_file(state.stats_file)
    supervision = control.read_supervision(cache_dir, Path(state.mountpoint))
    return Entry(
        mountpoint=state.mountpoint,
        kind="mount",
        entry=state.input,
        state=_mount_state(state, supervision),
        pid=state.pid,
        uri=state.uri,
        started=state.started,
        stats=_part(data, "cache"),
        metrics_url=state.metrics_url,
        rates=_part(data, "rates"),
        verdict=str(_part(data, "verdict").get("line", "")),
        restarts=supervision.restarts if supervision is not None else 0,
    )


def collect(cache_dir: Path) -> list[Entry]:
    """Every mount and upload output recorded under `cache_dir`, by mount point."""
    found: list[Entry] = []
    for path in sorted((cache_dir / "mounts").glob("*.json")):
        entry = _mount_entry(cache_dir, path)
        if entry is not None:
            found.append(entry)
    for path in sorted((cache_dir / "outputs").glob("*.json")):
        try:
            record = upload_records.UploadOutput(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        found.append(
            Entry(
                mountpoint=record.mountpoint,
                kind="upload",
                entry=record.output,
                state="waiting for unmount (uploads then)",
                started=path.stat().st_mtime,
            )  # fmt: skip
        )
    return sorted(found, key=lambda e: e.mountpoint)


READY_TIMEOUT = 5.0  # a mount answers a statfs in ~1 ms; a probe's own timeout is longer


def ready(mountpoint: Path, timeout: float = READY_TIMEOUT) -> str | None:
    """None when a datamount mount at `mountpoint` answers; else why not."""
    entry = find_mount(mountpoint)
    if entry is None:
        return "not mounted"
    if entry.fstype != FSTYPE:
        return f"not a datamount mount ({entry.fstype})"
    failure: list[str] = []

    def probe() -> None:
        try:
            os.statvfs(mountpoint)
            with os.scandir(mountpoint) as listing:
                next(listing, None)
        except OSError as exc:
            failure.append(exc.strerror or type(exc).__name__)

    # daemon=True: a thread stuck in a hung FUSE request must not keep the probe alive
    worker = threading.Thread(target=probe, name="ready-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return f"no answer within {timeout:g} s"
    return f"does not answer: {failure[0]}" if failure else None


def describe(entry: Entry, now: float | None = None) -> str:
    """One line for people."""
    now = time.time() if now is None else now
    parts = [f"{entry.mountpoint}: {entry.kind} {entry.entry}, {entry.state}"]
    if entry.pid is not None:
        parts.append(f"pid {entry.pid}")
    if entry.started is not None:
        parts.append(f"up {max(0.0, now - entry.started):.0f} s")
    if entry.restarts:
        parts.append(f"{entry.restarts} restart{'s' if entry.restarts != 1 else ''}")
    if entry.uri:
        parts.append(entry.uri)
    stats = entry.stats
    if stats:
        parts.append(
            f"{stats.get('bytes_fetched', 0)} bytes fetched, "
            f"{stats.get('ram_hits', 0)} RAM / {stats.get('disk_hits', 0)} disk hits"
        )
    if entry.rates:
        parts.append(rate_text(entry.rates))
    if entry.verdict:
        parts.append(entry.verdict)
    if entry.metrics_url:
        parts.append(f"metrics {entry.metrics_url}")
    return "; ".join(parts)


def rate_text(rates: dict[str, float]) -> str:
    return (
        f"{rates.get('storage_mb_s', 0):.1f} MB/s from storage, "
        f"{rates.get('read_mb_s', 0):.1f} MB/s read, {rates.get('requests_s', 0):.0f} req/s, "
        f"hit ratio {rates.get('hit_ratio', 0):.0%} (last {rates.get('seconds', 0):.0f} s)"
    )


def table(entries: list[Entry]) -> list[str]:
    """The `status --watch` table on a terminal: one row per entry."""
    rows = [f"{'MOUNT POINT':30} {'STATE':10} {'STORAGE':>10} {'READ':>10} {'REQ/S':>7} "
            f"{'HITS':>5}  VERDICT"]  # fmt: skip
    for e in entries:
        r = e.rates
        state = e.state.split(" ")[0]
        rows.append(
            f"{e.mountpoint[-30:]:30} {state[:10]:10} "
            f"{r.get('storage_mb_s', 0):>6.1f} MB/s {r.get('read_mb_s', 0):>5.1f} MB/s "
            f"{r.get('requests_s', 0):>7.0f} {r.get('hit_ratio', 0):>5.0%}  {e.verdict or '-'}"
        )
    return rows


def run(ctx: Context, args: argparse.Namespace) -> None:
    """`status [--json] [--watch [SECONDS]] [--ready MOUNTPOINT]`."""
    if args.ready is not None:
        why = ready(Path(args.ready))
        if why is not None:
            raise DatamountError(f"{args.ready}: not ready: {why}")  # exit 1
        print(f"{args.ready}: ready")
        return
    if args.watch is not None:
        with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
            _watch(ctx, args, args.watch)
        return
    entries = collect(ctx.settings.cache_dir)
    for entry in entries:
        print(json.dumps(entry.as_dict(), sort_keys=True) if args.json else describe(entry))
    if not entries and not args.json:
        print(f"{PROG}: nothing mounted (cache {ctx.settings.cache_dir})", file=sys.stderr)


def _watch(ctx: Context, args: argparse.Namespace, seconds: float) -> None:
    """`status --watch`: a redrawn table on a terminal (plain ANSI), else one
    line per mount per refresh (JSON with --json). Ctrl-C ends it (exit 0)."""
    import time

    tty = sys.stdout.isatty() and not args.json
    while True:
        entries = collect(ctx.settings.cache_dir)
        if tty:
            rows = table(entries) if entries else ["nothing mounted"]
            sys.stdout.write("\x1b[H\x1b[2J" + "\n".join(rows) + "\n")
        else:
            now = time.time()
            for entry in entries:
                line = (
                    json.dumps({**entry.as_dict(), "time": now}, sort_keys=True)
                    if args.json
                    else f"{time.strftime('%H:%M:%S')} {describe(entry, now)}"
                )
                sys.stdout.write(line + "\n")
        sys.stdout.flush()
        time.sleep(seconds)
