"""Serving one mount from its plan: build the stack (mount.stack), start the
daemon (mount.daemon), answer the start-up handshake, serve until unmounted.

`python -m datamount.mount.serve MOUNTPOINT --ready-fd N` is the background
mount daemon `datamount mount` spawns: it reads its `MountPlan` (one JSON
line) from the start-up channel N and answers on the same channel. It reads
no spec, no workspace and no setting from its environment: all of it is in
the plan. `mount --foreground` calls `start` and `run` in its own process.

Threads: the caller's (main) thread; the daemon and the stack own theirs.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamount import __version__
from datamount.errors import (
    EXIT_OK,
    DataError,
    DatamountError,
    OutputError,
    StorageError,
)
from datamount.log import register_secret, setup_logging, shutdown_logging
from datamount.mount import control
from datamount.mount.daemon import DaemonConfig, MountDaemon, limit_malloc_arenas
from datamount.mount.diagnose import Watch
from datamount.mount.hintsocket import HintServer
from datamount.mount.plan import MountPlan
from datamount.mount.stack import Stack, attribute_ttl, build

log = logging.getLogger("datamount.daemon")


@dataclass
class Served:
    plan: MountPlan
    stack: Stack
    daemon: MountDaemon


def start(plan: MountPlan) -> Served:
    """Build the stack and mount it; returns once the mount answers. With
    DATAMOUNT_METRICS_PORT set, its metrics endpoint is up first (an address
    in use fails the mount: DataError)."""
    limit_malloc_arenas()  # before the stack's threads: they would each take an arena
    stack = build(plan)
    try:
        snapshot = _snapshot(plan, stack)
        watch = Watch(plan.settings, str(plan.mountpoint))
        url = _metrics(plan, stack, snapshot, watch)
        hints = _hints(plan, stack)
        daemon = MountDaemon(stack.fs, _config(plan, url, hints), _recorder(snapshot, watch))
        daemon.start()
    except BaseException:
        stack.close()
        raise
    return Served(plan, stack, daemon)


def run(
    served: Served, readiness: control.Readiness, on_ready: Callable[[Path], None] | None = None
) -> None:
    """The mount answers: tell whoever waits, then serve until unmounted.
    OutputError when an rw_mount ends with writes only staged."""
    plan = served.plan
    # What start-up built (modules, the stack) lives as long as the mount: out
    # of the cyclic collector's sight, so its full passes stay short
    # (docs/design/ro_mount.md, "The daemon and the GIL").
    gc.freeze()
    try:
        readiness.ok()
        if on_ready is not None:
            on_ready(plan.path)
        served.daemon.run()
    finally:
        served.stack.close()
    leftovers = served.daemon.leftovers
    if leftovers:
        raise OutputError(f"{plan.label}: {leftovers.describe(str(plan.staging))}")


def _hints(plan: MountPlan, stack: Stack) -> str:
    """The hint socket for loaders (block mode); its path or "" without one."""
    ahead = stack.ahead
    if ahead is None:
        return ""
    server = HintServer(plan.mountpoint, lambda paths, replace: ahead.hint(paths, replace=replace))
    if not server.start():
        return ""
    stack.cleanup.callback(server.close)
    return str(server.path)


def _config(plan: MountPlan, metrics_url: str = "", hints_socket: str = "") -> DaemonConfig:
    settings = plan.settings
    stats_file = control.stats_path(settings.log_dir, plan.name, plan.mountpoint)
    state = control.MountState(
        pid=os.getpid(),
        mountpoint=str(plan.mountpoint),
        spec=plan.spec,
        input=plan.name,
        uri=plan.location.uri(),
        started=time.time(),
        stats_file=str(stats_file),
        mode=plan.mode,
        staging=str(plan.staging or ""),
        metrics_url=metrics_url,
        hints_socket=hints_socket,
    )
    return DaemonConfig(
        mountpoint=plan.mountpoint,
        fsname=f"datamount:{control.safe_name(plan.name)}",
        ttl_seconds=attribute_ttl(settings),
        drain_timeout=settings.unmount_timeout_seconds,
        # One FUSE worker per concurrent storage read, at least libfuse's 10.
        max_threads=max(16, settings.read_threads),
        state=state,
        state_file=control.state_file(settings.cache_dir, plan.mountpoint),
        stats_file=stats_file,
    )


def _snapshot(plan: MountPlan, stack: Stack) -> Callable[[], dict[str, Any]]:
    uri = plan.location.uri()
    restarts = control.restart_count(plan.settings.cache_dir, plan.mountpoint)  # mount.supervise

    def snapshot() -> dict[str, Any]:
        return {
            "mountpoint": str(plan.mountpoint),
            "input": plan.name,
            "uri": uri,
            "pid": os.getpid(),
            "updated": time.time(),
            "cpu_seconds": round(time.process_time(), 3),
            "restarts": restarts,
            # Retries happen in the store's policy, shared by every request.
            "cache": {**stack.stats.snapshot(), **_retries(stack)},
            "fs": stack.fs.counters(),
            "budget": _budget(stack),
        }

    return snapshot


def _retries(stack: Stack) -> dict[str, int]:
    retry = stack.retry.stats
    return {"retries": retry.retries, "throttled": retry.throttled, "exhausted": retry.exhausted,
            "outages": retry.outages}  # fmt: skip


def _budget(stack: Stack) -> dict[str, Any]:
    budget = stack.budget
    if budget is None:
        return {}
    return {
        "limits": dict(budget.limits),
        "used": {area: budget.in_use(area) for area in budget.limits},
        "peak": budget.peak,
    }


def _recorder(snapshot: Callable[[], dict[str, Any]], watch: Watch) -> Callable[[], dict[str, Any]]:
    """What the daemon writes to its stats file every interval (and at
    unmount): the snapshot, evaluated by the diagnosis, with its verdict and
    the rates over the last interval."""

    def record() -> dict[str, Any]:
        snap = snapshot()
        verdict = watch.update(snap)
        snap["verdict"] = verdict.as_dict() if verdict is not None else None
        snap["rates"] = watch.rates
        return snap

    return record


def _metrics(
    plan: MountPlan, stack: Stack, snapshot: Callable[[], dict[str, Any]], watch: Watch
) -> str:
    """Start the metrics endpoint when DATAMOUNT_METRICS_PORT is set; its URL or ""."""
    settings = plan.settings
    if settings.metrics_port is None:
        return ""
    from datamount import metrics  # prometheus-client: only when metrics are on
    from datamount.fs import funnel

    endpoint = metrics.Endpoint()
    hooks = getattr(getattr(stack.store, "raw", None), "hooks", None)
    requests = endpoint.requests if isinstance(hooks, list) else None
    if isinstance(hooks, list):
        hooks.append(endpoint.requests)

    def scraped() -> dict[str, Any]:
        snap = snapshot()
        snap["verdict"] = watch.current.as_dict() if watch.current is not None else None
        return snap

    endpoint.add(metrics.MountCollector(scraped, requests))
    url = endpoint.start(settings.metrics_host, settings.metrics_port)
    stack.cleanup.callback(endpoint.stop)
    stack.stats.on_read = endpoint.observe_read()
    funnel.set_observer(endpoint.observe_fuse())
    stack.cleanup.callback(funnel.set_observer, None)
    log.info("metrics of %s at %s", plan.mountpoint, url)
    return url


def main(argv: Sequence[str] | None = None) -> int:
    """The background daemon: plan in, handshake out, serve; the exit code."""
    parser = argparse.ArgumentParser(prog="datamount-mount-daemon")
    parser.add_argument("mountpoint", help="the mount point (also for `ps`)")
    parser.add_argument("--ready-fd", type=int, required=True, help="the start-up channel")
    args = parser.parse_args(argv)
    readiness = control.Readiness(args.ready_fd)
    try:
        plan = MountPlan.from_json(control.receive_line(args.ready_fd))
    except (ValueError, KeyError, TypeError) as exc:
        return _fail(readiness, DataError(f"no mount plan on the start-up channel ({exc})"))
    for secret in plan.secrets():
        register_secret(secret)
    settings = plan.settings
    try:
        setup_logging(settings.log_dir, level=settings.log_level,
                      settings_lines=settings.describe())  # fmt: skip
    except OSError as exc:
        print(
            f"datamount: warning: cannot write logs to {settings.log_dir}: {exc}", file=sys.stderr
        )
    log.info("datamount %s: mount daemon for %s (%s)", __version__, plan.mountpoint, plan.label)
    try:
        run(start(plan), readiness)
        return EXIT_OK
    except DatamountError as exc:
        return _fail(readiness, exc)
    except StorageError as exc:  # storage refused before any layer could say more
        return _fail(readiness, DataError(str(exc)))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the last line of defence: one line, traceback in the log
        if isinstance(exc, OSError) and exc.filename is not None:  # the local disk (cache)
            log.info("mount failed", exc_info=True)
            return _fail(readiness, DataError(f"{exc.filename}: {exc.strerror or exc}"))
        log.exception("unexpected error in the mount daemon")
        return _fail(readiness, DatamountError(
            f"unexpected {type(exc).__name__}: {exc} (details in {settings.log_dir})"))  # fmt: skip
    finally:
        shutdown_logging()


def _fail(readiness: control.Readiness, exc: DatamountError) -> int:
    log.info("mount failed: %s", exc)
    readiness.fail(exc)
    for line in str(exc).splitlines() or [type(exc).__name__]:
        print(f"datamount: error: {line}", file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":  # pragma: no cover  (the spawned daemon)
    sys.exit(main())
