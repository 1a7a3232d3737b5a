"""`make bench-diagnose`: provoke each verdict of the mount diagnosis
(src/datamount/mount/diagnose.py) with the settings and load that should cause
it, and check that the daemon names it (issue 13, Build item 3).

One dataset in an in-memory Azurite: D, one blob (512 MiB x --scale, at least
128 MiB) mounted as a uri_file. Each scenario is one fresh `datamount mount`
with its own DATASET_MOUNT_* settings and one reader subprocess that reads for
--intervals + 1 stats intervals (5 s each); meanwhile the benchmark polls the
daemon's stats file (what `datamount status` shows), and the verdict seen is
the daemon's most frequent verdict over the intervals that lay wholly inside
the load (the first one, which straddles the load's start, does not count).
The table shows the scenario, its settings, the expected and seen verdicts,
PASS/FAIL, every rule that fired (the benchmark re-runs mount.diagnose on the
same snapshots: the daemon keeps only the first) and the counters behind them.

Scenarios: none (a sequential reader paced to 2/3 of the file in the load),
idle (no reads), prefetch_window (a 1-block window, a fast sequential reader),
read_threads (1 read thread, 8 reader threads), throttled (tests/faultproxy.py's
FaultProxy in front of a plain-HTTP Azurite answering 503 to 20% of ranged
GETs), random_reads (seeded random 64 KiB preads), disk_queue (1 disk-cache
writer, a 1-block queue, 2 fast readers), cpu (8 threads of 4 KiB O_DIRECT
preads over a region already in the RAM tier). Every mount but disk_queue's
runs without the disk tier and with a 16 MB RAM tier, so readers looping over
the file keep fetching.

Usage: benchmarks/diagnose.py [--scenarios none,idle,...] [--scale 0.5]
                              [--intervals 3] [--keep] [--http]
Over HTTPS by default (the throttled scenario always talks HTTP to its proxy).
Exit 0 when every scenario showed its verdict, 1 otherwise, 130 when
interrupted. Imports datamount only to re-run the rules on the snapshots.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as bc
from _common import MiB
from mount import KNOBS, Failed, daemons

sys.path.insert(0, str(bc.REPO / "tests"))
from faultproxy import FaultProxy  # noqa: E402

STORE = "bench"
PYTHON, HERE = sys.executable, str(Path(__file__).resolve())
DATAMOUNT = str(Path(sys.executable).parent / "datamount")
INTERVAL = 5.0  # the daemon's stats interval (mount/control.py STATS_INTERVAL)
THROTTLE_SHARE = 0.2  # of ranged GETs answered 503 in the throttled scenario
BASE = {  # every scenario's mount unless it says otherwise
    "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "false",
    "DATASET_MOUNT_MEMORY_CACHE_SIZE": "16MB",
}


@dataclass(frozen=True)
class Scenario:
    name: str
    expected: str  # the verdict key
    settings: dict[str, str]  # on top of BASE
    reader: tuple[str, ...]  # KIND ARGS... (see `reader`)
    proxy: bool = False  # through a FaultProxy answering 503 to THROTTLE_SHARE


SCENARIOS = [
    Scenario("none", "none", {}, ("seq", "1", str(MiB), "pass")),
    Scenario("idle", "idle", {}, ("idle",)),
    Scenario("prefetch_window", "prefetch_window",
             {"DATASET_MOUNT_READ_BUFFER_BLOCK_COUNT": "1"}, ("seq", "1", str(MiB), "0")),
    Scenario("read_threads", "read_threads",
             {"DATASET_MOUNT_READ_THREADS": "1"}, ("seq", "8", str(MiB), "0")),
    Scenario("throttled", "throttled", {}, ("seq", "2", str(MiB), "0"), proxy=True),
    Scenario("random_reads", "random_reads", {}, ("random", "1", str(64 * 1024))),
    Scenario("disk_queue", "disk_queue",
             {"DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED": "true",
              "DATASET_MOUNT_BLOCK_FILE_CACHE_WRITE_THREADS": "1",
              "DATASET_MOUNT_BLOCK_FILE_CACHE_MAX_QUEUE_SIZE": "2MB"},
             ("seq", "2", str(MiB), "0")),
    Scenario("cpu", "cpu", {}, ("small", "8", "4096", str(8 * MiB))),
]  # fmt: skip


# -- the reader subprocess -------------------------------------------------------------


def reader(path: Path, seconds: float, kind: str, args: list[str]) -> dict[str, Any]:
    """Read `path` for `seconds` as `kind` says; bytes and reads done.

    seq THREADS SIZE MBPS: each thread reads its slice of the file in SIZE reads,
    over and over (its pages evicted after each pass), at most MBPS MB/s each (0:
    as fast as it can; "pass": 2/3 of the file in `seconds`). random THREADS
    SIZE: seeded random preads. small THREADS SIZE REGION: O_DIRECT preads at
    random offsets in the first REGION bytes, read once first so that they sit
    in the RAM tier. idle: sleep."""
    deadline = time.monotonic() + seconds
    if kind == "idle":
        time.sleep(seconds)
        return {"bytes": 0, "ops": 0}
    threads, size = int(args[0]), int(args[1])
    total = path.stat().st_size
    done = [0, 0]
    lock = threading.Lock()

    def count(n: int) -> None:
        with lock:
            done[0] += n
            done[1] += 1

    def seq(index: int) -> None:
        part = total // threads
        start, end = index * part, (index + 1) * part
        # "pass": one pass over the file takes 1.5 x the load (a reader that never
        # wraps around to the start, where the prefetch window starts over)
        pace = total / seconds / 1.5 if args[2] == "pass" else float(args[2]) * 1e6
        began = time.monotonic()
        read = 0
        fd = os.open(path, os.O_RDONLY)
        try:
            while time.monotonic() < deadline:
                for off in range(start, end, size):
                    if time.monotonic() >= deadline:
                        break
                    read += len(os.pread(fd, size, off))
                    count(size)
                    if pace and (ahead := read / pace - (time.monotonic() - began)) > 0:
                        time.sleep(ahead)
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def randomly(index: int) -> None:
        rng = random.Random(index)
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        try:
            reads = 0
            while time.monotonic() < deadline:
                count(len(os.pread(fd, size, rng.randrange(0, total - size))))
                reads += 1
                if reads % 64 == 0:  # the kernel's page cache would soon hold it all
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def small(index: int) -> None:
        region = min(int(args[2]), total)
        rng = random.Random(index)
        buf: mmap.mmap | None = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError:  # no O_DIRECT: evict the pages every 64 reads instead
            fd, buf = os.open(path, os.O_RDONLY), None
        try:
            reads = 0
            while time.monotonic() < deadline:
                off = rng.randrange(0, region // size) * size
                if buf is not None:
                    count(os.preadv(fd, [buf], off))
                else:
                    count(len(os.pread(fd, size, off)))
                    reads += 1
                    if reads % 64 == 0:
                        os.posix_fadvise(fd, 0, region, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    if kind == "small":  # the region into the RAM tier first
        with open(path, "rb", buffering=0) as f:
            f.read(int(args[2]))
    work = {"seq": seq, "random": randomly, "small": small}[kind]
    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"bytes": done[0], "ops": done[1]}


# -- one scenario ---------------------------------------------------------------------


@dataclass
class Result:
    scenario: Scenario
    seen: str = ""
    verdicts: list[str] = field(default_factory=list)  # the daemon's, one per loaded interval
    fired: list[str] = field(default_factory=list)  # every rule, over all loaded intervals
    line: str = ""  # the daemon's line for the verdict seen
    counters: str = ""
    sched: str = ""  # the daemon's on-CPU and run-queue time over the load (schedstat)
    failed: str = ""

    @property
    def ok(self) -> bool:
        return not self.failed and self.seen == self.scenario.expected


class Bench:
    def __init__(self, opts: argparse.Namespace, workdir: Path) -> None:
        self.opts, self.workdir = opts, workdir
        self.azurite = bc.BenchAzurite(workdir / "azurite", tls=bc.certs_for(workdir, opts.http))
        self.plain: bc.BenchAzurite | None = None  # the throttled scenario's, over HTTP
        self.proxy: FaultProxy | None = None
        self.size = max(128 * MiB, int(512 * MiB * opts.scale))

    def env(self, scratch: Path, settings: dict[str, str]) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(KNOBS)}
        keep.update(AZURITE_ACCOUNT_KEY=self.azurite.key, **self.azurite.trust_env())
        keep.update(DATAMOUNT_CACHE_DIR=str(scratch / "cache"))
        return {**keep, "DATAMOUNT_LOG_DIR": str(scratch / "logs"), **BASE, **settings}

    def prepare(self) -> None:
        """D seeded into the Azurite (and the plain one with its proxy, if wanted)."""
        start = time.perf_counter()
        ds = bc.make_local(bc.Dataset("D", "D/big.bin", [bc.SeedFile("big.bin", self.size)]),
                           self.workdir / "src")  # fmt: skip
        bc.seed(self.azurite.create_container(STORE), ds)
        if any(s.proxy for s in self.opts.scenarios):
            plain = self.azurite
            if not self.opts.http:
                plain = self.plain = bc.BenchAzurite(self.workdir / "azurite-http")
                plain.start()
                bc.seed(plain.create_container(STORE), ds)
            self.proxy = FaultProxy(plain.port)
        print(f"seeded D: {ds.describe()} in {time.perf_counter() - start:.1f} s", flush=True)

    def workspace(self, scratch: Path, endpoint: str) -> Path:
        path = scratch / "workspace.yaml"
        path.write_text(
            f"datastores:\n  {STORE}:\n    type: azure_blob\n"
            f"    account_name: {self.azurite.account}\n    container_name: {STORE}\n"
            f"    endpoint: {endpoint}\n"
            '    credentials: {account_key: "${AZURITE_ACCOUNT_KEY}"}\n'
        )
        return path

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.close()
        for azurite in (self.plain, self.azurite):
            if azurite is not None:
                azurite.stop()


@contextlib.contextmanager
def mounted(bench: Bench, sc: Scenario) -> Iterator[tuple[Path, Path, dict[str, str], set[int]]]:
    """`datamount mount` of D with the scenario's settings: (file, stats file,
    env, the daemon's pids)."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{sc.name}-", dir=bench.workdir))
    mp, env, spec = scratch / "mnt", bench.env(scratch, sc.settings), scratch / "spec.yaml"
    endpoint = bench.proxy.endpoint if sc.proxy and bench.proxy else bench.azurite.endpoint
    ws = bench.workspace(scratch, endpoint)
    spec.write_text(f"type: uri_file\npath: azureml://datastores/{STORE}/paths/D/big.bin\n"
                    "mode: ro_mount\n")  # fmt: skip
    try:
        argv = [DATAMOUNT, "mount", str(spec), str(mp), "--workspace", str(ws)]
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise Failed("datamount mount did not return in 120 s") from None
        if done.returncode != 0 or not (pids := daemons(scratch / "cache", mp)):
            last = (done.stderr.strip().splitlines() or ["no daemon found"])[-1]
            raise Failed(f"datamount mount: exit {done.returncode}: {last}")
        stats = next((scratch / "logs").glob("mount-stats-input-*.json"))
        yield Path(done.stdout.strip().splitlines()[-1]), stats, env, pids
    finally:
        with bc.signals_deferred():
            unmount = [DATAMOUNT, "unmount", str(mp), "--timeout", "10"]
            bc.end_mount(mp, daemons(scratch / "cache", mp), unmount, env=env)


def throttle(proxy: FaultProxy, stop: threading.Event) -> None:
    """Keep 503s at THROTTLE_SHARE of the ranged GETs answered: every 20 ms,
    queue as many failures as the forwarded ones call for."""
    ratio = THROTTLE_SHARE / (1 - THROTTLE_SHARE)
    while not stop.wait(0.02):
        gets = proxy.ranged_gets()
        failed = sum(r.injected == "fail" for r in gets)
        want = int(ratio * (len(gets) - failed)) - failed - proxy.pending()[0]
        if want > 0:
            proxy.fail_ranged(want)


def run(bench: Bench, sc: Scenario) -> Result:
    result = Result(sc)
    seconds = (bench.opts.intervals + 1) * INTERVAL + 1.0
    with mounted(bench, sc) as (path, stats, env, pids):
        snaps: list[dict[str, Any]] = []

        def poll() -> None:
            with contextlib.suppress(OSError, ValueError):
                snap = json.loads(stats.read_text())
                if not snaps or snap.get("updated") != snaps[-1].get("updated"):
                    snaps.append(snap)

        stop = threading.Event()
        feeder = None
        if sc.proxy and bench.proxy is not None:
            bench.proxy.reset()
            feeder = threading.Thread(target=throttle, args=(bench.proxy, stop), daemon=True)
            feeder.start()
        poll()
        began, sched0 = time.time(), schedstat(pids)
        argv = [PYTHON, HERE, "reader", str(path), str(seconds), *sc.reader]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=bc._die_with_parent)  # fmt: skip
        try:
            while proc.poll() is None:
                poll()
                time.sleep(0.25)
            ended, sched1 = time.time(), schedstat(pids)
            poll()
        finally:
            stop.set()
            if proc.poll() is None:
                proc.kill()
            out, err = proc.communicate()
            if feeder is not None:
                feeder.join()
        if proc.returncode != 0:
            result.failed = (
                f"reader exit {proc.returncode}: {(err.strip().splitlines() or [''])[-1]}"
            )
            return result
    secs = ended - began
    on_cpu, waiting = ((b - a) / 1e9 / secs for a, b in zip(sched0, sched1, strict=True))
    result.sched = f"schedstat: on CPU {on_cpu:.2f} cores, threads runnable {waiting:.2f}"
    judge(result, snaps, began, ended, env)
    return result


def schedstat(pids: set[int]) -> tuple[int, int]:
    """Nanoseconds the daemon's threads ran and waited on a run queue
    (/proc/<pid>/task/*/schedstat; threads that ended are not counted)."""
    ran = waited = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError):
                fields = task.read_text().split()
                ran, waited = ran + int(fields[0]), waited + int(fields[1])
    return ran, waited


def judge(
    result: Result, snaps: list[dict[str, Any]], began: float, ended: float, env: dict[str, str]
) -> None:
    """The daemon's verdicts over the intervals wholly inside the load, the rules
    fired (re-run on the same snapshots) and the counters summed over them."""
    from datamount.mount.diagnose import diagnose
    from datamount.settings import Settings

    pairs = [
        (a, b)
        for a, b in zip(snaps, snaps[1:], strict=False)
        if a["updated"] >= began and b["updated"] <= ended + 0.5
    ]
    if not pairs:
        result.failed = f"no whole stats interval inside the load ({len(snaps)} snapshots)"
        return
    result.verdicts = [(b.get("verdict") or {}).get("key", "-") for _, b in pairs]
    counts = Counter(result.verdicts)
    top = max(counts.values())
    result.seen = next(v for v in reversed(result.verdicts) if counts[v] == top)
    result.line = next(
        b["verdict"]["line"] for _, b in pairs if (b.get("verdict") or {}).get("key") == result.seen
    )
    settings = Settings.from_env(env)
    fired: Counter[str] = Counter()
    for a, b in pairs:
        fired.update(v.key for v in diagnose(a, b, settings))
    result.fired = [f"{k} {n}/{len(pairs)}" for k, n in fired.most_common()]
    first, last = pairs[0][0], pairs[-1][1]

    def d(part: str, name: str) -> float:
        return float(last.get(part, {}).get(name, 0)) - float(first.get(part, {}).get(name, 0))

    secs = last["updated"] - first["updated"]
    requests, throttled, offers = d("cache", "fetch_requests"), d("cache", "throttled"), 0.0
    offers = d("cache", "prefetch_offers")
    blocks = d("cache", "blocks_fetched")
    parts = [
        f"{d('fs', 'bytes_read') / secs / 1e6:.0f} MB/s read",
        f"{(last['cpu_seconds'] - first['cpu_seconds']) / secs:.2f} cores",
        f"{d('cache', 'fetch_us') / 1e6 / secs:.1f}/{settings.read_threads} threads busy",
        f"{d('cache', 'fetch_us') / 1e3 / requests if requests else 0:.0f} ms/req",
        f"{requests / secs:.0f} req/s",
        f"window full {d('cache', 'prefetch_window_full') / offers if offers else 0:.0%}",
        f"misses {d('cache', 'misses'):.0f}",
        f"prefetch used {d('cache', 'prefetch_used'):.0f}",
        f"hits {d('cache', 'ram_hits') + d('cache', 'disk_hits'):.0f}",
        f"demand {(blocks - d('cache', 'prefetched_blocks')) / blocks if blocks else 0:.0%}",
        f"throttled {throttled / (requests + throttled) if requests + throttled else 0:.0%}",
        f"dropped {d('cache', 'disk_queue_dropped'):.0f}",
        f"fs reads {d('fs', 'reads') / secs:.0f}/s",
    ]
    result.counters = ", ".join(parts)


def report(results: list[Result]) -> None:
    print("\nverdicts (seen = the daemon's most frequent over the loaded intervals):")
    print(f"  {'scenario':<16} {'expected':<16} {'seen':<16} {'':4}  settings")
    for r in results:
        sc = r.scenario
        mark = "PASS" if r.ok else "FAIL"
        knobs = {**BASE, **sc.settings}
        settings = " ".join(f"{k.removeprefix('DATASET_MOUNT_')}={v}" for k, v in knobs.items())
        print(f"  {sc.name:<16} {sc.expected:<16} {r.seen or '-':<16} {mark}  {settings}")
        print(f"  {'':<16} load: {' '.join(sc.reader)}{', 503 to 20%' if sc.proxy else ''}")
        if r.failed:
            print(f"  {'':<16} {r.failed}")
            continue
        print(f"  {'':<16} intervals: {' '.join(r.verdicts)}; rules fired: {', '.join(r.fired)}")
        print(f"  {'':<16} {r.counters}; {r.sched}")
        print(f'  {"":<16} "{r.line}"')


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    names = [s.name for s in SCENARIOS]
    parser.add_argument("--scenarios", default=",".join(names), help="comma-separated")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the file, e.g. 0.5")
    parser.add_argument("--intervals", type=int, default=3, help="stats intervals judged (3)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--http", action="store_true", help="plain HTTP (default: HTTPS)")
    opts = parser.parse_args(argv)
    wanted = [w.strip() for w in opts.scenarios.split(",") if w.strip()]
    if not wanted or set(wanted) - set(names):
        parser.error(f"--scenarios takes {', '.join(names)}")
    if not 0 < opts.scale <= 1 or opts.intervals < 1:
        parser.error("0 < --scale <= 1 and --intervals >= 1")
    opts.scenarios = [s for s in SCENARIOS if s.name in wanted]
    return opts


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    if argv[:1] == ["reader"] and len(argv) >= 4:
        print(json.dumps(reader(Path(argv[1]), float(argv[2]), argv[3], argv[4:])))
        return 0
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    bench = Bench(opts, workdir := Path(tempfile.mkdtemp(prefix="datamount-diagnose-bench-")))
    print(f"datamount diagnosis benchmark: {os.cpu_count()} cores, over "
          f"{'HTTP' if opts.http else 'HTTPS'}, scale {opts.scale:g}, {opts.intervals} "
          f"intervals of {INTERVAL:g} s per scenario, work folder {workdir}")  # fmt: skip
    if (load := os.getloadavg()[0]) > 0.5:
        print(f"warning: load average {load:.2f} before start; other processes share the CPUs")
    results: list[Result] = []
    try:
        bench.azurite.start()
        bench.prepare()
        for sc in opts.scenarios:
            try:
                result = run(bench, sc)
            except Failed as exc:
                result = Result(sc, failed=str(exc))
            results.append(result)
            mark = "PASS" if result.ok else "FAIL"
            print(f"  {sc.name:<16} {mark} seen {result.seen or '-'} {result.failed}", flush=True)
        report(results)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        with bc.signals_deferred():
            bc.detach_leftovers(workdir)
            bench.stop()
            if opts.keep:
                print(f"kept {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    bad = sum(not r.ok for r in results)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print(f"{bad} scenario(s) without their verdict" if bad else "every verdict provoked")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
