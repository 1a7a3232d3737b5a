"""`make bench`, second half: datamount's ro_mount against baselines on the same machine
and data in one run, reported as ratios (issue 4, item 8 and Targets); the run ends by
writing its record to benchmarks/records/ (_common.write_record).

Datasets in an in-memory Azurite: A one 1 GiB blob (a uri_file mount), B 2,000 x 256 KiB
in 20 folders, L 20,000 tiny blobs in one folder (uri_folder mounts). Workloads, each on
a fresh mount (2 re-reads through the mount of 1) by a reader subprocess that times only
the workload and checks the bytes after the clock stops: 1 cold sequential read of A in
1 MiB reads (sha256), 2 warm re-read (sha256), 3 2,000 seeded random 64 KiB preads of A
(each against the source slice), 4 all of B by 8 threads (sha256 each), 5 os.walk + stat
of B, 6 the first os.scandir entry of L against the full listing, 7 all of B by 1 thread
in listing order, 8 by 1 thread in a seeded shuffled order, 9 the same order sent to the
daemon's hint socket first (file-ahead prefetch, issues 16 and 14), 10 200 seeded random
64 KiB preads per GiB of A (a sparse reader: it must stay on demand, bytes fetched <= 2 x the
distinct blocks touched; issue 16), 11 A by 8 threads, each sequential over its own eighth in
1 MiB preads, through one open handle (a model loader; issue 29), 12 the same through 8
handles (sha256 of the whole), 13-15 B by a torch DataLoader of 4 workers over
datamount.data's FileDataset in listing order, shuffled, and shuffled with the order sent by
`FileDataset.hint` (issue 29), 16-19 a restarted job over what the previous mount cached (A
sequentially, B by 8 threads; a first mount reads until every block is on disk, then unmount,
drop the page cache, mount again over that cache folder; 18 and 19 with the cache on a tmpfs;
root only) against "cache files", the block files themselves read by the same reader after
dropping the page cache (issue 27), 20 all of B by 1 thread in listing order with a 4 ms
step after each file (a training loop the file-ahead prefetch keeps ahead of: its files open
natively, issue 27). Around each workload:
the daemon's CPU and peak RSS (/proc/<pid>/stat, VmHWM reset first), its stats file's
bytes_fetched, and the bytes Azurite sent (/proc io). Baselines: `datamount download` of
A and B, the downloaded A from local disk (evicted with posix_fadvise) and page cache,
and fsspec's FUSE over adlfs (fusepy, libfuse2) for 1, 3 (60 s budget) and 4. Every mount
is taken down in a finally, Ctrl-C and SIGTERM included (fusermount3 -uz, SIGKILL last).
At the end (benchmarks/_scale.py): per datamount workload the daemon's CPU per GiB and
per 1,000 files, its GIL-held share (py-spy attached around the workload, _gil.py;
--no-gil skips it) and the projected ceiling, then its peak RSS against its memory budget.

Over HTTPS by default (Azurite with a throwaway CA's leaf certificate, trusted by every
contender through SSL_CERT_FILE / REQUESTS_CA_BUNDLE), `--http` for plain HTTP; the
s/GiB column is the CPU seconds (reader + daemon) per GiB read. `--delay-ms D` puts a
delay line (_delay.py: D ms each way, 2 x D more on a new connection) between datamount
and Azurite, as a cloud store's latency (in-region blob storage: ~5-20 ms); fsspec's
FUSE is not behind it.

Usage: benchmarks/mount.py [--datasets A,B,L] [--workloads 1,...,20] [--repeat N]
                           [--scale 0.1] [--keep] [--no-fsspec] [--http] [--no-gil]
                           [--delay-ms D]
                           [--datamount-env NAME=VALUE ...]
Exit 0 when all ran and checked out (targets are reported, not enforced), 1 otherwise,
130 when interrupted. DATASET_*, RSLEX_*, DATAMOUNT_* variables are cleared for the
contenders: the targets assume default settings; --datamount-env sets one back for a
measured variant. Never imports datamount.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import _common as bc
import _scale
from _common import MB, Dataset, MiB, measure
from _delay import DelayLine
from _gil import GilSample, Sampler, isolated
from azure.storage.blob import ContainerSasPermissions, generate_container_sas
from transfer import write_workspace

STORE = "bench"
PYTHON, HERE = sys.executable, str(Path(__file__).resolve())
DATAMOUNT = str(Path(sys.executable).parent / "datamount")
READ, PREAD, PREADS, SEED, THREADS = MiB, 64 * 1024, 2000, 4, 8
# Workload 10: 200 preads over 1 GiB touch ~165 of its 512 blocks (32 %: no dense
# fill); --scale keeps the proportion (100 preads over 512 MiB).
SPARSE_PREADS = 200
BLOCK = 2 * MiB  # DATASET_MOUNT_READ_BLOCK_SIZE's default
RSS_BOUND_MIB = 128 + 512 + 150  # RAM tier + disk-queue bound (defaults) + 150 MiB
FSSPEC_BUDGET = 60.0  # seconds: fsspec's FUSE fetches a whole adlfs block per random read
STATS_WAIT = 6.0  # the daemon rewrites its stats file every 5 s
KNOBS = ("DATASET_", "RSLEX_", "DATAMOUNT_")
NAMES = {1: "1 cold sequential", 2: "2 warm re-read", 3: "3 random 64 KiB",
         4: "4 B, 8 threads", 5: "5 walk + stat B", 6: "6 scandir L",
         7: "7 B, 1 thr listing", 8: "8 B, 1 thr shuffle", 9: "9 B, shuffle+hint",
         10: "10 sparse random", 11: "11 A, 8 parts 1 fd", 12: "12 A, 8 parts 8 fds",
         13: "13 B, loader list", 14: "14 B, loader shuf", 15: "15 B, loader hint",
         16: "16 A recached", 17: "17 B recached", 18: "18 A recached tmpfs",
         19: "19 B recached tmpfs", 20: "20 B, 1 thr, step"}  # fmt: skip
NEEDS = {1: "A", 2: "A", 3: "A", 4: "B", 5: "B", 6: "L", 7: "B", 8: "B", 9: "B", 10: "A",
         11: "A", 12: "A", 13: "B", 14: "B", 15: "B", 16: "A", 17: "B", 18: "A",
         19: "B", 20: "B"}  # fmt: skip
# Workloads 16-19 (issue 27): a restarted job reading what the previous mount cached. A first
# mount reads the data until every block is in its disk tier; unmount, drop the page cache,
# mount again over the same cache folder and read it all (A sequentially, B by 8 threads);
# 18 and 19 with the cache folder on a tmpfs. Baseline "cache files": the block files
# themselves read by the same reader after dropping the page cache (no FUSE at all).
RECACHE = {16: ("A", False), 17: ("B", False), 18: ("A", True), 19: ("B", True)}
# Workloads 13-15 (issue 29): a DataLoader of LOADER_WORKERS over FileDataset, in each order.
LOADER = {13: "listing", 14: "shuffled", 15: "hinted"}
LOADER_WORKERS = 4
# Workloads 11 and 12 (issue 29): THREADS sequential streams over A, on 1 handle or on THREADS.
PARTS = {11: 1, 12: THREADS}
BY_BYTES = (
    1,
    2,
    4,
    7,
    8,
    9,
    11,
    12,
    13,
    14,
    15,
    16,
    17,
    18,
    19,
    20,
)  # rated in MB/s (the others in ops/s)
# Workloads 7-9 (issues 16 and 14): one reader thread over B in listing order, in a
# seeded shuffled order, and in that order told to the daemon first (a loader hint);
# 20 (issue 27): in listing order with a STEP after each file.
ONE_THREAD = {7: "listing", 8: "shuffled", 9: "hinted", 20: "stepped"}
STEP = 0.004  # seconds: a training step per file, so that the prefetch gets ahead
ORDER = ("datamount", "download", "local cache", "local disk", "cache files", "fsspec FUSE")


class Failed(Exception):
    """A contender that could not run (mount failed, unavailable, timed out)."""


# -- the reader and fsspec subprocesses ---------------------------------------------------


def offsets(size: int, count: int) -> list[int]:
    rng = random.Random(SEED)
    return [rng.randrange(0, max(1, size - PREAD + 1)) for _ in range(count)]


def reader(kind: str, path: Path, args: list[str]) -> dict:
    """One workload: seconds and CPU of the timed part; amounts and checks after it
    (what was read stays in memory until then)."""

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def stop(**out: object) -> dict:
        return {"seconds": time.perf_counter() - clock[0], "cpu": cpu() - clock[1], **out}

    size = path.stat().st_size if kind in ("seq", "random", "parts") else 0
    view = memoryview(bytearray(size if kind in ("seq", "parts") else 0))  # pre-faulted
    clock = [time.perf_counter(), cpu()]
    if kind == "seq":
        pos = 0
        with open(path, "rb", buffering=0) as f:
            while pos < size and (n := f.readinto(view[pos : pos + READ])):
                pos += n
        out = stop(bytes=pos, ops=-(-pos // READ), problems=0)
        return {**out, "sha256": hashlib.sha256(view[:pos]).hexdigest()}
    if kind == "parts":  # args: HANDLES; THREADS readers, each over its own part
        fds = [os.open(path, os.O_RDONLY) for _ in range(int(args[0]))]
        part = -(-size // THREADS)

        def stream(i: int) -> int:
            pos, end = i * part, min(size, (i + 1) * part)
            while pos < end and (n := os.preadv(fds[i % len(fds)], [view[pos : pos + READ]], pos)):
                pos += n
            return pos - i * part

        with ThreadPoolExecutor(THREADS) as pool:
            total = sum(pool.map(stream, range(THREADS)))
        for fd in fds:
            os.close(fd)
        out = stop(bytes=total, ops=-(-total // READ), problems=int(total != size))
        return {**out, "sha256": hashlib.sha256(view[:size]).hexdigest()}
    if kind == "loader":  # args: LIST ORDER; torch's DataLoader over datamount.data
        return loader(path, args, clock, stop)
    if kind == "random":  # args: SOURCE COUNT BUDGET
        wanted, got = offsets(size, int(args[1])), []
        with open(path, "rb", buffering=0) as f:
            for off in wanted:
                got.append(os.pread(f.fileno(), PREAD, off))
                if time.perf_counter() - clock[0] > float(args[2]):
                    break
        out = stop(bytes=sum(map(len, got)), ops=len(got))
        src = os.open(args[0], os.O_RDONLY)
        pairs = zip(wanted[: len(got)], got, strict=True)
        return {**out, "problems": sum(d != os.pread(src, PREAD, o) for o, d in pairs)}
    if kind == "files":  # args: LIST (lines "rel<TAB>sha256") [THREADS [ORDER]]
        entries = [line.split("\t") for line in Path(args[0]).read_text().splitlines()]
        threads = int(args[1]) if len(args) > 1 else THREADS
        order = args[2] if len(args) > 2 else "listing"
        step = STEP if order == "stepped" else 0.0
        if order not in ("listing", "stepped"):
            random.Random(SEED).shuffle(entries)
        if order == "hinted":  # the daemon's hint socket, as datamount.data.hint sends it
            send_hint(path, [rel for rel, _ in entries])

        def get(rel: str) -> bytes:
            with open(path / rel, "rb", buffering=0) as f:
                data = f.read()
            if step:
                time.sleep(step)
            return data

        with ThreadPoolExecutor(threads) as pool:
            datas = list(pool.map(get, [rel for rel, _ in entries]))
        out = stop(bytes=sum(map(len, datas)), ops=len(datas))
        digests = zip(entries, map(hashlib.sha256, datas), strict=True)
        return {**out, "problems": sum(h.hexdigest() != sha for (_, sha), h in digests)}
    if kind == "raw":  # args: LIST (absolute paths) THREADS; bytes counted, nothing checked
        paths = Path(args[0]).read_text().splitlines()

        def whole(name: str) -> int:
            with open(name, "rb", buffering=0) as f:
                return len(f.read())

        with ThreadPoolExecutor(int(args[1])) as pool:
            total = sum(pool.map(whole, paths))
        return stop(bytes=total, ops=len(paths), problems=0)
    if kind == "walk":  # args: "COUNT TOTAL"
        sizes = [os.stat(os.path.join(top, n)).st_size for top, _, ns in os.walk(path) for n in ns]
        return stop(bytes=0, ops=len(sizes), problems=int(f"{len(sizes)} {sum(sizes)}" != args[0]))
    if kind == "scandir":  # args: COUNT
        with os.scandir(path) as it:
            count = int(next(it, None) is not None)
            first = time.perf_counter() - clock[0]
            count += sum(1 for _ in it)
        return stop(bytes=0, ops=count, first=first, problems=int(count != int(args[0])))
    raise SystemExit(f"unknown workload {kind!r}")


def loader(path: Path, args: list[str], clock: list[float], stop: Callable[..., dict]) -> dict:
    """All of B through a DataLoader of LOADER_WORKERS processes over FileDataset
    (its listing taken before the clock starts), in listing order, shuffled, or
    shuffled with the order sent first by FileDataset.hint."""
    from torch.utils.data import DataLoader

    from datamount.data import FileDataset

    wanted = dict(line.split("\t") for line in Path(args[0]).read_text().splitlines())
    files = FileDataset(path)
    order = list(range(len(files)))
    if args[1] != "listing":
        random.Random(SEED).shuffle(order)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    clock[:] = [time.perf_counter(), usage.ru_utime + usage.ru_stime]
    if args[1] == "hinted" and not files.hint(order):
        raise SystemExit("FileDataset.hint found no datamount mount")
    batches: DataLoader[tuple[str, bytes]] = DataLoader(
        files, sampler=order, batch_size=None, num_workers=LOADER_WORKERS
    )
    got = [(rel, hashlib.sha256(data).hexdigest(), len(data)) for rel, data in batches]
    out = stop(bytes=sum(n for _, _, n in got), ops=len(got))
    problems = sum(wanted.get(rel) != sha for rel, sha, _ in got) + abs(len(got) - len(wanted))
    return {**out, "problems": problems}


def send_hint(root: Path, rels: list[str]) -> None:
    """One hint batch to the mount holding `root` (README: ro_mount, "File-ahead
    prefetch"): a JSON line on /tmp/datamount-<uid>/<sha256(mount point)[:16]>.sock,
    answered by one line."""
    import socket

    mp = os.path.abspath(root)
    while not os.path.ismount(mp):
        mp = os.path.dirname(mp)
    base = os.path.relpath(root, mp).strip(".").strip("/")
    digest = hashlib.sha256(os.path.normpath(mp).encode()).hexdigest()[:16]
    line = json.dumps({"files": [f"{base}/{r}" if base else r for r in rels], "replace": True})
    with socket.socket(socket.AF_UNIX) as conn:
        conn.connect(f"/tmp/datamount-{os.geteuid()}/{digest}.sock")
        conn.sendall(line.encode() + b"\n")
        if not json.loads(conn.makefile("rb").readline()).get("ok"):
            raise SystemExit("the daemon refused the hint")


def serve_fsspec(mountpoint: str) -> None:
    """fsspec's own FUSE (fsspec.fuse.run, multithreaded) over adlfs, in the foreground."""
    try:
        import fuse  # noqa: F401  (fusepy, which fsspec.fuse needs, over libfuse2)
    except (ImportError, OSError) as exc:
        raise SystemExit(f"fusepy not importable: {exc}") from None
    import fsspec.fuse
    from adlfs import AzureBlobFileSystem

    fs = AzureBlobFileSystem(connection_string=os.environ["BENCH_CONNECTION_STRING"])
    fsspec.fuse.run(fs, f"{STORE}/", mountpoint, foreground=True, threads=True)


# -- mounts and measuring ----------------------------------------------------------------


@dataclass
class Server:
    """A mounted filesystem: the process serving it, where the data shows, its stats."""

    pid: int
    root: Path
    stats_file: Path | None = None
    fetched: int = 0  # bytes_fetched in the stats file after the previous workload
    ahead_used: int = 0  # files_prefetch_used (file-ahead prefetch), likewise
    ahead_delta: int = 0  # files fetched ahead and then opened in the last workload
    budget: dict = field(default_factory=dict)  # the stats file's "budget" (limits, peak)
    ram_tier: int | None = None  # bytes, from the runtime log's "read path" line

    def fetched_since(self, since: float) -> int | None:
        """bytes_fetched since the previous workload, once the daemon rewrote its stats
        file after `since`; None when there is no such file or counter."""
        data: dict = {}
        for _ in range(int(STATS_WAIT / 0.2)) if self.stats_file else ():
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(self.stats_file.read_text())  # type: ignore[union-attr]
            if data.get("updated", 0) >= since:
                break
            time.sleep(0.2)
        self.budget = data.get("budget") or self.budget
        if (total := data.get("cache", {}).get("bytes_fetched")) is None:
            return None
        delta, self.fetched = total - self.fetched, total
        used = data["cache"].get("files_prefetch_used", 0)
        self.ahead_used, self.ahead_delta = used, used - self.ahead_used
        return delta


@dataclass
class Row:
    """One measured run; `failed` or `problems` mark it as not to be trusted."""

    workload: int
    contender: str
    seconds: float = 0.0
    bytes: int = 0
    ops: int = 0
    cpu: float | None = None  # the reader's
    server_cpu: float | None = None  # the daemon's; a download's own for download rows
    server_rss: float | None = None
    fetched: int | None = None  # the daemon's bytes_fetched counter
    sent: int = 0  # bytes Azurite sent meanwhile
    first: float | None = None
    ahead: int = 0  # files the daemon fetched whole before their open (files_prefetch_used)
    gil: GilSample | None = None  # py-spy on the daemon around the workload (--no-gil: None)
    budget_mib: float | None = None  # the daemon's one memory budget, its peak use so far
    budget_peak_mib: float | None = None
    ram_tier_mib: float | None = None
    failed: str = ""
    problems: list[str] = field(default_factory=list)


class Bench:
    """Options, the Azurite, the datasets, and every row measured so far."""

    def __init__(self, opts: argparse.Namespace, workdir: Path) -> None:
        self.opts, self.workdir, self.workloads = opts, workdir, opts.workloads
        self.azurite = bc.BenchAzurite(workdir / "azurite", tls=bc.certs_for(workdir, opts.http))
        self.sets: dict[str, Dataset] = {}
        self.ws = workdir / "workspace.yaml"
        self.rows: dict[tuple[int, str], list[Row]] = {}
        self.fsspec_unavailable = ""
        self.startup = 0.0
        self.records: list[dict] = []  # the report's rows, for the run's record
        self.delay: DelayLine | None = None  # --delay-ms: between datamount and Azurite

    def scratch(self, label: str) -> Path:
        """A fresh folder in the work folder, kept until the end of the run: on an
        ext4 without a journal (this VM) files created soon after many were deleted
        cost several times the kernel CPU (ext4 skips recently freed inodes), so
        deleting one contender's 2,000 files or 512 cache blocks would tax the next."""
        return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=self.workdir))

    def env(self, scratch: Path) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(KNOBS)}
        keep.update(AZURITE_ACCOUNT_KEY=self.azurite.key)  # secrets by variable, never argv
        keep.update(BENCH_CONNECTION_STRING=self.azurite.connection_string)
        keep.update(DATAMOUNT_CACHE_DIR=str(scratch / "cache"), **self.azurite.trust_env())
        return {**keep, "DATAMOUNT_LOG_DIR": str(scratch / "logs"), **self.opts.datamount_env}

    def add(self, row: Row) -> None:
        self.rows.setdefault((row.workload, row.contender), []).append(row)
        why = row.failed or "; ".join(row.problems)
        head = f"  {NAMES[row.workload]:<18} {row.contender:<12}"
        print(f"{head} FAIL {why[:100]}" if why else f"{head} {row.seconds:7.2f} s  ok", flush=True)


@contextlib.contextmanager
def datamount_mount(bench: Bench, ds: Dataset, scratch: Path | None = None) -> Iterator[Server]:
    """`datamount mount` of `ds` in a fresh scratch folder (cache, logs, mount point),
    or in `scratch` again (its cache as the last mount there left it)."""
    scratch = scratch or bench.scratch(f"mount-{ds.name}")
    mp, env, spec = scratch / "mnt", bench.env(scratch), scratch / "spec.yaml"
    kind = "uri_file" if ds.is_file else "uri_folder"
    spec.write_text(f"type: {kind}\npath: {uri(ds)}\nmode: ro_mount\n")
    try:
        try:
            argv = [DATAMOUNT, "mount", str(spec), str(mp), "--workspace", str(bench.ws)]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise Failed("datamount mount did not return in 120 s") from None
        if done.returncode != 0 or not (pids := daemons(scratch / "cache", mp)):
            last = (done.stderr.strip().splitlines() or ["no daemon found"])[-1]
            raise Failed(f"datamount mount: exit {done.returncode}: {last}")
        # mount-stats-<entry>-<hash of the mount point>.json, written at mount
        stats = next((scratch / "logs").glob("mount-stats-input-*.json"), None)
        server = Server(min(pids), Path(done.stdout.strip().splitlines()[-1]), stats)
        server.ram_tier = _scale.ram_tier(scratch / "logs")
        yield server
    finally:
        with bc.signals_deferred():
            unmount = [DATAMOUNT, "unmount", str(mp), "--timeout", "10"]
            bc.end_mount(mp, daemons(scratch / "cache", mp), unmount, env=env)


def daemons(cache: Path, mp: Path) -> set[int]:
    """The daemon serving `mp`: from its state file under cache/mounts/, or any process
    whose command line names `mp` with --foreground (a daemon that wrote no state)."""
    pids = set()
    for state in (cache / "mounts").glob("*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            if (data := json.loads(state.read_text()))["mountpoint"] == str(mp):
                pids.add(int(data["pid"]))
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if proc.name.isdigit() and str(mp).encode() in argv and b"--foreground" in argv:
                pids.add(int(proc.name))
    return set(filter(bc.alive, pids))


@contextlib.contextmanager
def fsspec_mount(bench: Bench) -> Iterator[Server]:
    """fsspec's FUSE over adlfs on the whole container (`mount.py serve-fsspec`)."""
    scratch = bench.scratch("fsspec")
    (mp := scratch / "mnt").mkdir()
    with open(scratch / "serve.log", "wb") as log:
        proc = subprocess.Popen(
            [PYTHON, HERE, "serve-fsspec", str(mp)],
            env=bench.env(scratch),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches us, not it: we take it down in order
            preexec_fn=bc._die_with_parent,
        )
    try:
        deadline = time.monotonic() + 30
        while not (bc.mounted(mp) and answers(mp)):  # its ready_file answers EIO to stat
            if proc.poll() is not None:
                lines = (scratch / "serve.log").read_text(errors="replace").strip().splitlines()
                raise Failed(f"unavailable ({(lines or ['exited'])[-1]})")
            if time.monotonic() > deadline:
                raise Failed("fsspec's FUSE did not answer in 30 s")
            time.sleep(0.1)
        yield Server(proc.pid, mp)
    finally:
        with bc.signals_deferred():
            bc.end_mount(mp, {proc.pid})
            proc.kill()
            proc.wait()


def answers(mp: Path) -> bool:
    try:
        return bool(os.listdir(mp))
    except OSError:
        return False


def uri(ds: Dataset) -> str:
    return f"azureml://datastores/{STORE}/paths/{ds.prefix}"


def probe(
    bench: Bench, row: Row, server: Server | None, kind: str, path: Path, *args: str, sha: str = ""
) -> Row:
    """Run one workload in a reader subprocess, sampling the server around it."""
    os.sync()  # dirty pages of earlier steps (local copies, downloads) are not its cost
    pid = server.pid if server else 0
    cpu0 = bc.proc_cpu(pid) if pid else 0.0
    if pid:
        bc.proc_peak_rss_mib(pid, reset=True)  # this workload's peak, from the current RSS
    sent0 = bc.azurite_bytes_sent(bench.azurite)
    argv = [PYTHON, HERE, "reader", kind, str(path), *args]
    sampler = Sampler(pid) if pid and bench.opts.gil else contextlib.nullcontext()
    alone = (
        isolated(pid, [bench.azurite.pid])
        if pid and bench.opts.isolate
        else contextlib.nullcontext("")
    )
    with alone, sampler:  # py-spy attached before the reader starts, detached after it ended
        run = measure(argv, bench.env(bench.workdir), 120 + (1 << 30) / (5 * MB))
    if isinstance(sampler, Sampler):
        row.gil = sampler.result
    row.sent = bc.azurite_bytes_sent(bench.azurite) - sent0
    if server:
        try:
            row.server_cpu, row.server_rss = bc.proc_cpu(pid) - cpu0, bc.proc_peak_rss_mib(pid)
        except OSError:
            row.failed = "the serving process died"
        row.fetched = server.fetched_since(time.time())
        row.ahead = server.ahead_delta
        row.budget_mib, row.budget_peak_mib = _scale.budget_mib(server.budget)
        row.ram_tier_mib = None if server.ram_tier is None else server.ram_tier / MiB
    if run.ok and not row.failed:
        got = json.loads(run.stdout.strip().splitlines()[-1])
        for key in ("seconds", "cpu", "bytes", "ops", "first"):
            setattr(row, key, got.get(key))
        if got["problems"]:
            row.problems.append(f"{got['problems']} wrong read(s), file(s) or count(s)")
        if sha and got["sha256"] != sha:
            row.problems.append("sha256 of the bytes read differs from the seeded data")
    row.failed = row.failed or run.note
    return row


# -- the contenders ----------------------------------------------------------------------


def attempt(bench: Bench, workloads: tuple[int, ...], who: str, body: Callable) -> None:
    """Run `body(wanted)` (which adds rows); Failed marks every wanted workload failed."""
    if wanted := [w for w in workloads if w in bench.workloads]:
        try:
            body(wanted)
        except Failed as exc:
            for w in wanted:
                bench.add(Row(w, who, failed=str(exc)))


def random_args(bench: Bench, budget: float, count: int = PREADS) -> tuple[str, str, str]:
    """SOURCE COUNT BUDGET for the random reader: the seeded local copy of A."""
    a = bench.sets.get("A")
    source = a.local / a.files[0].rel if a and a.local else ""
    return str(source), str(count), str(budget)


def run_datamount(bench: Bench) -> None:
    """Each workload on a fresh `datamount mount`; 2 re-reads through the mount of 1."""
    a, b, lst = (bench.sets.get(n) for n in "ABL")

    def on(ds: Dataset | None, kind: str, *args: str) -> Callable[[list[int]], None]:
        def body(wanted: list[int]) -> None:
            assert ds is not None
            sha = ds.files[0].sha256 if kind in ("seq", "parts") else ""
            with datamount_mount(bench, ds) as server:
                for w in [1, 2] if 2 in wanted else wanted:  # a warm read needs a cold one
                    row = probe(
                        bench, Row(w, "datamount"), server, kind, server.root, *args, sha=sha
                    )
                    if w in wanted:
                        bench.add(row)

        return body

    attempt(bench, (1, 2), "datamount", on(a, "seq"))
    attempt(bench, (3,), "datamount", on(a, "random", *random_args(bench, 1e9)))
    sparse = random_args(
        bench, 1e9, max(1, round(SPARSE_PREADS * (a.total if a else 0) / (1 << 30)))
    )
    attempt(bench, (10,), "datamount", on(a, "random", *sparse))
    attempt(bench, (4,), "datamount", on(b, "files", str(bench.workdir / "B.list")))
    attempt(bench, (5,), "datamount", on(b, "walk", f"{len(b.files)} {b.total}" if b else ""))
    attempt(bench, (6,), "datamount", on(lst, "scandir", str(len(lst.files) if lst else 0)))
    for w, order in ONE_THREAD.items():
        attempt(bench, (w,), "datamount", on(b, "files", str(bench.workdir / "B.list"), "1", order))
    for w, handles in PARTS.items():
        attempt(bench, (w,), "datamount", on(a, "parts", str(handles)))
    for w, order in LOADER.items():
        attempt(bench, (w,), "datamount", on(b, "loader", str(bench.workdir / "B.list"), order))


def block_files(cache: Path) -> list[str]:
    return sorted(map(str, (cache / "blocks").glob("*/??/*.blk")))


def drop_page_cache() -> None:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3")
    except OSError as exc:
        raise Failed(f"cannot drop the page cache (root only): {exc.strerror}") from None


@contextlib.contextmanager
def cache_folder(scratch: Path, tmpfs: bool) -> Iterator[Path]:
    """scratch/cache, on a tmpfs of its own when asked (unmounted at the end)."""
    cache = scratch / "cache"
    cache.mkdir(mode=0o700)
    if not tmpfs:
        yield cache
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g,mode=0700", "tmpfs", str(cache)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise Failed(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield cache
    finally:
        subprocess.run(["umount", "-l", str(cache)], capture_output=True)


def run_recached(bench: Bench) -> None:
    """Workloads 16-19: datamount over the cache a first mount filled, and the block
    files themselves ("cache files"), each after dropping the page cache."""
    for w, (name, tmpfs) in RECACHE.items():
        ds = bench.sets.get(name)

        def body(
            wanted: list[int], w: int = w, ds: Dataset | None = ds, tmpfs: bool = tmpfs
        ) -> None:
            assert ds is not None
            scratch = bench.scratch(f"recache-{ds.name}")
            kind, args = ("seq", ()) if ds.is_file else ("files", (str(bench.workdir / "B.list"),))
            sha = ds.files[0].sha256 if ds.is_file else ""
            blocks = sum(-(-f.size // BLOCK) for f in ds.files)
            with cache_folder(scratch, tmpfs) as cache:
                with datamount_mount(bench, ds, scratch) as server:  # fill the cache
                    filled = probe(bench, Row(w, "datamount"), server, kind, server.root, *args)
                    deadline = time.monotonic() + 120
                    while len(block_files(cache)) < blocks and time.monotonic() < deadline:
                        time.sleep(0.2)
                if filled.failed or len(block_files(cache)) < blocks:
                    raise Failed(f"the first mount cached {len(block_files(cache))} of "
                                 f"{blocks} blocks {filled.failed}")  # fmt: skip
                drop_page_cache()
                with datamount_mount(bench, ds, scratch) as server:
                    bench.add(probe(bench, Row(w, "datamount"), server, kind, server.root, *args,
                                    sha=sha))  # fmt: skip
                listing = scratch / "blocks.list"
                listing.write_text("\n".join(block_files(cache)) + "\n")
                drop_page_cache()
                threads = "1" if ds.is_file else str(THREADS)
                bench.add(probe(bench, Row(w, "cache files"), None, "raw", listing, str(listing),
                                threads))  # fmt: skip

        attempt(bench, (w,), "datamount", body)


def run_baselines(bench: Bench) -> None:
    """`datamount download` of A and B; the downloaded A read from disk and page cache."""
    for ds, w in ((bench.sets.get("A"), 1), (bench.sets.get("B"), 4)):
        wanted = [x for x in ((1, 2, 3) if w == 1 else (4,)) if x in bench.workloads]
        if ds is None or not wanted:
            continue
        scratch = bench.scratch(f"download-{ds.name}")
        (dest := scratch / "dest").mkdir()
        os.sync()  # as before every workload (probe)
        sent0 = bc.azurite_bytes_sent(bench.azurite)
        argv = [DATAMOUNT, "download", uri(ds), str(dest), "--workspace", str(bench.ws)]
        run = measure(argv, bench.env(scratch), 120 + ds.total / (5 * MB))
        row = Row(w, "download", run.seconds, ds.total, len(ds.files), failed=run.note)
        row.server_cpu, row.server_rss = run.cpu, run.rss_mib
        row.sent = bc.azurite_bytes_sent(bench.azurite) - sent0
        if run.ok:  # hashing every file also leaves A in the page cache for workload 2
            row.problems = bc.verify_tree(dest, ds, frozenset({".datamount-manifest.jsonl"}))
        bench.add(row)
        if w != 1 or row.failed or row.problems:
            continue
        local, sha = dest / ds.files[0].rel, ds.files[0].sha256
        local_runs = (
            (2, "local cache", "seq"),
            (1, "local disk", "seq"),
            (3, "local disk", "random"),
        )
        for x, who, kind in local_runs:
            if x in wanted:
                if who == "local disk":
                    bc.drop_page_cache(local)
                args, want = (random_args(bench, 1e9), "") if x == 3 else ((), sha)
                bench.add(probe(bench, Row(x, who), None, kind, local, *args, sha=want))


def run_fsspec(bench: Bench) -> None:
    """fsspec's FUSE over adlfs, a fresh one per workload; 'unavailable' is no failure."""
    a = bench.sets.get("A")
    listed, randomly = (str(bench.workdir / "B.list"),), random_args(bench, FSSPEC_BUDGET)
    jobs = [
        (1, "seq", "A/big.bin", ()),
        (4, "files", "B", listed),
        (3, "random", "A/big.bin", randomly),
    ]
    for w, kind, rel, args in jobs:
        if w not in bench.workloads or bench.fsspec_unavailable:
            continue
        sha = a.files[0].sha256 if a and kind == "seq" else ""
        try:
            with fsspec_mount(bench) as server:
                row = Row(w, "fsspec FUSE")
                bench.add(probe(bench, row, server, kind, server.root / rel, *args, sha=sha))
        except Failed as exc:
            if not str(exc).startswith("unavailable"):
                bench.add(Row(w, "fsspec FUSE", failed=str(exc)))
                continue
            bench.fsspec_unavailable = str(exc)[len("unavailable (") : -1]
            print(f"  fsspec FUSE: unavailable ({bench.fsspec_unavailable})", flush=True)


# -- reporting ---------------------------------------------------------------------------


def pick(rows: list[Row]) -> Row:
    """The fastest good run with the highest daemon peak RSS of all; a bad run wins."""
    if bad := [r for r in rows if r.failed or r.problems]:
        return bad[0]
    rss = [r.server_rss for r in rows if r.server_rss is not None]
    peak = [r.budget_peak_mib for r in rows if r.budget_peak_mib is not None]
    best = min(rows, key=lambda r: r.seconds)
    return replace(best, server_rss=max(rss) if rss else None,
                   budget_peak_mib=max(peak) if peak else None)  # fmt: skip


def report(bench: Bench) -> dict[tuple[int, str], Row]:
    best = {key: pick(rows) for key, rows in bench.rows.items()}
    print(f"\nbest of {bench.opts.repeat}; rd = the reader, dm = the daemon (for download rows "
          "the downloader), fetched = its bytes_fetched counter, sent = by Azurite:")  # fmt: skip
    print(f"  {'workload':<18} {'contender':<12} {'seconds':>7} {'rate':>14} {'rd CPU':>6} "
          f"{'dm CPU':>6} {'s/GiB':>6} {'dm MiB':>6} {'fetched':>10} {'sent':>10}"
          "  check")  # fmt: skip

    def num(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    for key in sorted(best, key=lambda k: (k[0], ORDER.index(k[1]))):
        r = best[key]
        check = "FAIL " + (r.failed or "; ".join(r.problems)) if r.failed or r.problems else "ok"
        if r.first is not None:
            check += f", first entry after {r.first:.3f} s"
        if r.workload in ONE_THREAD and r.contender == "datamount":
            check += f", {r.ahead} of {r.ops} files fetched before their open"
        if r.workload == 10 and r.contender == "datamount" and r.fetched is not None:
            reads = offsets(bench.sets["A"].total, r.ops)
            blocks = {o // BLOCK for o in reads} | {(o + PREAD - 1) // BLOCK for o in reads}
            within = r.fetched <= 2 * len(blocks) * BLOCK
            check += f", fetched {'<=' if within else '>'} 2 x {len(blocks)} blocks touched"
        if r.workload == 3 and r.ops < PREADS and not r.failed:
            check += f", {r.ops} of {PREADS} reads in the {FSSPEC_BUDGET:g} s budget"
        rate, value, unit = "-", None, ""
        if r.seconds and not r.failed:
            by_bytes = r.workload in BY_BYTES
            per_s = (r.bytes / MB if by_bytes else r.ops) / r.seconds
            rate = f"{per_s:9.1f} MB/s" if by_bytes else f"{per_s:8,.0f} ops/s"
            value, unit = round(per_s, 1), "MB/s" if by_bytes else "ops/s"
        fetched = "n/a" if r.fetched is None else f"{r.fetched / MiB:.1f} MiB"
        # CPU per GiB read, reader and daemon together (TLS's cost: HTTPS against --http)
        cpu = (r.cpu or 0.0) + (r.server_cpu or 0.0)
        per_gib = cpu / (r.bytes / (1 << 30)) if r.bytes and r.workload in BY_BYTES else None
        print(f"  {NAMES[r.workload]:<18} {r.contender:<12} {r.seconds:7.2f} {rate:>14} "
              f"{num(r.cpu, '.2f'):>6} {num(r.server_cpu, '.2f'):>6} {num(per_gib, '.2f'):>6} "
              f"{num(r.server_rss, '.0f'):>6} "
              f"{fetched:>10} {r.sent / MiB:>6.1f} MiB  {check}")  # fmt: skip
        bench.records.append({
            "workload": NAMES[r.workload], "tool": r.contender, "rate": value, "unit": unit,
            "cpu_s": r.server_cpu and round(r.server_cpu, 2),
            "reader_cpu_s": r.cpu and round(r.cpu, 2),
            "rss_mib": r.server_rss and round(r.server_rss),
            **({"note": check} if check != "ok" else {}),
        })  # fmt: skip
    return best


def targets(bench: Bench, best: dict[tuple[int, str], Row]) -> None:
    def good(w: int, who: str) -> Row | None:
        r = best.get((w, who))
        return r if r and r.seconds > 0 and not r.failed and not r.problems else None

    def ratio(w: int, who: str, other: str, startup: float = 0.0) -> float | None:
        x, y = good(w, who), good(w, other)
        return x.bytes / x.seconds / (y.bytes / max(y.seconds - startup, 1e-3)) if x and y else None

    s, dm3, dm6 = bench.startup, good(3, "datamount"), good(6, "datamount")
    dm10 = good(10, "datamount")
    size = bench.sets["A"].total if "A" in bench.sets else 0

    def blocks_touched(reads: list[int]) -> set[int]:
        return {o // BLOCK for o in reads} | {(o + PREAD - 1) // BLOCK for o in reads}

    touched = blocks_touched(offsets(size, dm3.ops) if dm3 else [])
    bound = 2 * len(touched) * BLOCK / MiB
    sparse = blocks_touched(offsets(size, dm10.ops) if dm10 else [])
    sparse_bound = 2 * len(sparse) * BLOCK / MiB
    rss = {w: r.server_rss for (w, who), r in best.items() if who == "datamount" and r.server_rss}
    raw = [ratio(w, "datamount", "download") for w in (1, 4)]
    raw_text = [f"; {r:.2f} against its wall time" if r else "" for r in raw]
    goals = [
        (f"cold sequential >= 0.9 x datamount download of the file (net of {s:.2f} s start-up"
         f"{raw_text[0]})", ratio(1, "datamount", "download", s), 0.9, False),
        ("warm re-read >= 0.5 x the same file read from the page cache",
         ratio(2, "datamount", "local cache"), 0.5, False),
        (f"random preads: MiB fetched <= 2 x {len(touched)} blocks touched x {BLOCK // MiB} MiB"
         f" = {bound:.0f}", dm3.fetched / MiB if dm3 and dm3.fetched else None, bound, True),
        (f"sparse random preads ({dm10.ops if dm10 else 0}): MiB fetched <= 2 x {len(sparse)}"
         f" blocks touched x {BLOCK // MiB} MiB = {sparse_bound:.0f} (no dense fill)",
         dm10.fetched / MiB if dm10 and dm10.fetched else None, sparse_bound, True),
        (f"8 threads on B >= 0.9 x download of the tree (net of {s:.2f} s start-up"
         f"{raw_text[1]})", ratio(4, "datamount", "download", s), 0.9, False),
        (f"daemon peak RSS <= 128 + 512 + 150 = {RSS_BOUND_MIB} MiB in every workload (by "
         f"workload: {', '.join(f'{w}: {v:.0f}' for w, v in sorted(rss.items()))})",
         max(rss.values()) if rss else None, RSS_BOUND_MIB, True),
        ("first scandir entry of L <= 10% of the full listing time",
         dm6.first / dm6.seconds if dm6 and dm6.first is not None else None, 0.1, True),
    ]  # fmt: skip
    print("targets (issue 4):")
    for text, got, limit, at_most in goals:
        ok = None if got is None else got <= limit if at_most else got >= limit
        mark = "n/a " if ok is None else "PASS" if ok else "FAIL"
        print(f"  [{mark}] {text}" + ("" if got is None else f" (got {got:.3g})"))
    ahead = [
        ("1 reader thread over B in listing order >= 1 x 8 threads (file-ahead prefetch)",
         good(7, "datamount"), good(4, "datamount"), 1.0),
        ("1 reader thread over B shuffled, with the hint >= 3 x without (loader hints)",
         good(9, "datamount"), good(8, "datamount"), 3.0),
        ("A by 8 threads over their own eighths, one handle >= 0.9 x cold sequential",
         good(11, "datamount"), good(1, "datamount"), 0.9),
        ("A by 8 threads over their own eighths, 8 handles >= 0.9 x cold sequential",
         good(12, "datamount"), good(1, "datamount"), 0.9),
        (f"a DataLoader of {LOADER_WORKERS} over B shuffled and hinted >= 0.9 x in listing order",
         good(15, "datamount"), good(13, "datamount"), 0.9),
    ]  # fmt: skip
    print("targets (issues 16, 14 and 29):")
    for text, x, y, limit in ahead:
        got = x.bytes / x.seconds / (y.bytes / y.seconds) if x and y else None
        mark = "n/a " if got is None else "PASS" if got >= limit else "FAIL"
        print(f"  [{mark}] {text}" + ("" if got is None else f" (got {got:.3g})"))
    for w, (hinted, unhinted) in {"1 reader": (9, 8), "the DataLoader": (15, 14)}.items():
        if (x := good(hinted, "datamount")) and (y := good(unhinted, "datamount")):
            print(f"hinted / unhinted shuffle, {w}: {y.seconds / x.seconds:.2f}")
    vs = [f"{w}: {r:.2f}" for w in (1, 3, 4) if (r := ratio(w, "datamount", "fsspec FUSE"))]
    print("datamount / fsspec FUSE throughput: " + (", ".join(vs) or "n/a"))
    print("targets (issue 27, cached data; files/s and GB/s scale with the machine):")
    for wl, (name, tmpfs) in RECACHE.items():
        if not (x := good(wl, "datamount")):
            continue
        rate = (
            f"{x.ops / x.seconds:,.0f} files/s"
            if name == "B"
            else f"{x.bytes / x.seconds / 1e9:.2f} GB/s"
        )
        goal = ">= 8,000 files/s" if name == "B" else ">= 1.3 GB/s"
        per = (
            f", daemon {x.server_cpu / x.ops * 1e3:.3f} ms CPU per file"
            if name == "B" and x.server_cpu
            else ""
        )
        vs_files = ratio(wl, "datamount", "cache files")
        versus = f", {vs_files:.2f} x the cache files read directly" if vs_files else ""
        where = "tmpfs" if tmpfs else "disk (>= 0.9 x the cache files)"
        print(f"  {NAMES[wl]:<20} {rate}{per}{versus}; target on {where}: {goal}")


# -- main --------------------------------------------------------------------------------


def prepare(bench: Bench) -> None:
    """Local copies of A and B with digests, and everything seeded into Azurite."""
    needed, sets = {NEEDS[w] for w in bench.workloads}, bc.standard_datasets(bench.opts.scale)
    container, start = bench.azurite.create_container(STORE), time.perf_counter()
    for name in sorted(needed & {"A", "B"}):
        bench.sets[name] = bc.make_local(sets[name], bench.workdir / "src")
        bc.seed(container, bench.sets[name])
    if "B" in needed:
        lines = [f"{f.rel}\t{f.sha256}\n" for f in bench.sets["B"].files]
        (bench.workdir / "B.list").write_text("".join(lines))
    if "L" in needed:
        can = ContainerSasPermissions(write=True, create=True)
        until = datetime.now(UTC) + timedelta(days=1)
        sas = generate_container_sas(
            bench.azurite.account, STORE, bench.azurite.key, permission=can, expiry=until
        )
        bench.sets["L"] = bc.listing_dataset(bench.opts.scale)
        bc.seed_tiny(bench.azurite, STORE, sas, bench.sets["L"])
    write_workspace(bench.ws, bench.azurite, bench.delay.port if bench.delay else 0)
    described = "; ".join(f"{ds.name}: {ds.describe()}" for ds in bench.sets.values())
    print(f"seeded {described} in {time.perf_counter() - start:.1f} s")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--datasets", default="A,B,L", help="comma-separated: A, B, L")
    parser.add_argument(
        "--workloads",
        default="1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20",
        help="comma-separated: 1 to 20",
    )
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink datasets, e.g. 0.1")
    parser.add_argument("--no-fsspec", action="store_true", help="skip the fsspec FUSE baseline")
    parser.add_argument("--http", action="store_true", help="plain HTTP (default: HTTPS)")
    parser.add_argument(
        "--delay-ms",
        type=float,
        default=0.0,
        help="a delay line of this many ms each way between datamount and Azurite (_delay.py)",
    )
    parser.add_argument(
        "--no-gil", dest="gil", action="store_false", help="no py-spy on the daemon (GIL n/a)"
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="the daemon alone on the last CPU while each workload runs, the rest elsewhere: "
        "a GIL share without other processes' preemptions (_gil.isolated)",
    )
    parser.add_argument(
        "--datamount-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for every datamount run, mounts and download baselines (repeatable), e.g. "
        "DATASET_MOUNT_BLOCK_FILE_CACHE_ENABLED=false: the defaults are measured otherwise",
    )
    opts = parser.parse_args(argv)
    pairs = [item.partition("=") for item in opts.datamount_env]
    if any(not name.startswith(KNOBS) or not sep for name, sep, _ in pairs):
        parser.error("--datamount-env takes NAME=VALUE with a DATASET_, RSLEX_ or DATAMOUNT_ name")
    opts.datamount_env = {name: value for name, _, value in pairs}
    sets = {d.strip().upper() for d in opts.datasets.split(",") if d.strip()}
    wanted = {w.strip() for w in opts.workloads.split(",") if w.strip()}
    opts.workloads = sorted(w for w in NAMES if str(w) in wanted and NEEDS[w] in sets)
    if sets - set("ABL") or wanted - set(map(str, NAMES)) or not opts.workloads:
        parser.error("--datasets takes A, B, L and --workloads 1 to 20 (one of them needing them)")
    if opts.repeat < 1 or not 0 < opts.scale <= 1 or not 0 <= opts.delay_ms <= 1000:
        parser.error("--repeat >= 1, 0 < --scale <= 1 and 0 <= --delay-ms <= 1000")
    return opts


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM runs the same clean-up as Ctrl-C


def main(argv: list[str]) -> int:
    if argv[:1] == ["reader"] and len(argv) >= 3:
        print(json.dumps(reader(argv[1], Path(argv[2]), argv[3:])))
        return 0
    if argv[:1] == ["serve-fsspec"] and len(argv) == 2:
        serve_fsspec(argv[1])
        return 0
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    bench = Bench(opts, workdir := Path(tempfile.mkdtemp(prefix="datamount-mount-bench-")))
    scheme = "HTTP" if opts.http else "HTTPS"
    print(f"datamount mount benchmark: {os.cpu_count()} cores, over {scheme}, scale "
          f"{opts.scale:g}, best of {opts.repeat}, workloads {opts.workloads}, "
          f"work folder {workdir}")  # fmt: skip
    if (load := os.getloadavg()[0]) > 0.5:
        print(f"warning: load average {load:.2f} before start; other processes share the CPUs")
    if opts.isolate:
        cpus = sorted(os.sched_getaffinity(0))
        alone = f"each workload's server alone on CPU {cpus[-1]}, the rest on {cpus[:-1]}"
        print(f"isolate: {alone if len(cpus) > 1 else 'one CPU, nothing to isolate'}")
    stack = contextlib.ExitStack()
    try:
        runs = [measure([DATAMOUNT, "--version"], bench.env(workdir), 60) for _ in range(3)]
        bench.startup = min(r.seconds for r in runs)
        print(f"datamount start-up {bench.startup:.2f} s (best of 3 `datamount --version`)")
        bench.azurite.start()
        if opts.delay_ms:
            bench.delay = stack.enter_context(DelayLine(bench.azurite.port, opts.delay_ms))
            print(f"delay line: {opts.delay_ms:g} ms each way on port {bench.delay.port}")
        prepare(bench)
        for rep in range(opts.repeat):
            print(f"\nround {rep + 1} of {opts.repeat}")
            for contenders in (run_baselines, run_datamount, run_recached, run_fsspec):
                if not (opts.no_fsspec and contenders is run_fsspec):
                    contenders(bench)
        best = report(bench)
        targets(bench, best)
        _scale.report(best, NAMES, gil=opts.gil)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        with bc.signals_deferred():
            bc.detach_leftovers(workdir)
            stack.close()
            bench.azurite.stop()
            if opts.keep:
                print(f"kept {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    bad = sum(bool(r.failed or r.problems) for rows in bench.rows.values() for r in rows)
    if bench.records:
        bc.write_record("mount", bench.records, transport=scheme, options=vars(opts),
                        failed_runs=bad)  # fmt: skip
    print(f"MB/s is 10^6 bytes per second; load average at the end: {os.getloadavg()[0]:.2f}")
    print(f"{bad} failed run(s): see FAIL above" if bad else "every contender ran and checked out")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
