"""Shared benchmark helpers: an Azurite to measure against, seeded datasets,
one contender per subprocess (wall time, CPU seconds, peak RSS), byte checks and
tables, and process probes from /proc. The transfer and mount benchmarks use them.

Threads: seeding and hashing use small thread pools (the SDK and hashlib release
the GIL); everything else runs on the caller's thread. Imports the test
harness's Azurite launcher (tests/azurite.py) and the Azure SDK, never datamount
itself: contenders are driven through their command lines only.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from azure.storage.blob import ContainerClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the test harness's Azurite launcher

from _http import connection  # noqa: E402, I001
from azurite import Azurite, Certs, make_certs  # noqa: E402

MiB = 1 << 20
MB = 1_000_000  # throughput is reported in decimal MB/s
CHUNK = 8 * MiB  # generation and hashing chunk: large enough that the GIL is rarely held
HASH_THREADS = max(2, os.cpu_count() or 2)
RUSAGE = Path(__file__).with_name("_rusage.py")
RECORDS = REPO / "benchmarks" / "records"  # one JSON record per run; docs/benchmarks.md shows them


class BenchAzurite(Azurite):
    """The test harness's in-memory Azurite, plus its memory use (it holds every blob in
    RAM). Over HTTPS (the default of both benchmarks; `--http` for plain HTTP) it serves a
    leaf certificate of a throwaway CA made under `workdir`, which the contenders trust
    through `trust_env()` only: nothing is installed on the host (see `certs_for`)."""

    def trust_env(self) -> dict[str, str]:
        """The variables that make every contender trust this Azurite's CA (Python's
        ssl and OpenSSL: SSL_CERT_FILE; requests and the Azure SDK: REQUESTS_CA_BUNDLE)."""
        if self.tls is None:
            return {}
        return {"SSL_CERT_FILE": str(self.tls.ca), "REQUESTS_CA_BUNDLE": str(self.tls.ca)}

    @property
    def pid(self) -> int:
        """The Azurite node process (0 if not running)."""
        return 0 if self._proc is None else self._proc.pid

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the Azurite node process so far (0 if not running)."""
        proc = self._proc
        return 0.0 if proc is None else proc_cpu(proc.pid)

    def memory_mib(self) -> tuple[float, float]:
        """(current RSS, peak RSS) of the Azurite node process in MiB; (0, 0) if not running."""
        proc = self._proc
        if proc is None:
            return 0.0, 0.0
        fields: dict[str, float] = {}
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0]) / 1024  # kB
        return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def certs_for(workdir: Path, http: bool) -> Certs | None:
    """The benchmark's throwaway CA and Azurite's leaf under `workdir`; None with --http."""
    return None if http else make_certs(workdir / "certs")


# -- datasets -----------------------------------------------------------------


@dataclass(frozen=True)
class SeedFile:
    """One file of a dataset: path relative to the dataset, size, and digests of its bytes."""

    rel: str
    size: int
    sha256: str = ""
    md5: bytes = b""


@dataclass
class Dataset:
    """Files under one blob prefix. `prefix` is the blob name for a one-file dataset
    (uri_file, e.g. "A/big.bin") and ends with "/" for a folder (e.g. "B/")."""

    name: str
    prefix: str
    files: list[SeedFile]
    local: Path | None = field(default=None)  # the folder holding local copies, once made

    @property
    def is_file(self) -> bool:
        return not self.prefix.endswith("/")

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    def blob_name(self, rel: str) -> str:
        return self.prefix if self.is_file else self.prefix + rel

    def describe(self) -> str:
        size = self.files[0].size if len(set(f.size for f in self.files)) == 1 else 0
        each = f" x {_human(size)}" if size and len(self.files) > 1 else ""
        return f"{len(self.files):,} file(s){each}, {_human(self.total)} total"


def _human(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:g} {unit}" if n % scale == 0 else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def standard_datasets(scale: float = 1.0) -> dict[str, Dataset]:
    """A: one 1 GiB blob; B: 2,000 x 256 KiB in 20 folders; C: 10 x 100 MiB.
    `scale` shrinks big files' sizes and the small files' count (never their size,
    which is what makes B a per-request-cost test)."""
    big = max(MiB, int((1 << 30) * scale))
    part = max(MiB, int(100 * MiB * scale))
    count = max(20, round(2000 * scale))
    small = [SeedFile(f"d{i % 20:02d}/f{i // 20:04d}.bin", 256 * 1024) for i in range(count)]
    return {
        "A": Dataset("A", "A/big.bin", [SeedFile("big.bin", big)]),
        "B": Dataset("B", "B/", sorted(small, key=lambda f: f.rel)),
        "C": Dataset("C", "C/", [SeedFile(f"part-{i:02d}.bin", part) for i in range(10)]),
    }


def make_local(ds: Dataset, root: Path) -> Dataset:
    """Write seeded random bytes for every file of `ds` under root/<name>/, recording
    sha256 and md5; returns the dataset with digests and `local` set."""
    folder = root / ds.name

    def write(index_file: tuple[int, SeedFile]) -> SeedFile:
        index, f = index_file
        path = folder / f.rel
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = random.Random(f"{ds.name}/{index}")  # reproducible, ~770 MB/s
        sha, md5 = hashlib.sha256(), hashlib.md5()
        with open(path, "wb") as out:
            left = f.size
            while left:
                chunk = rng.randbytes(min(CHUNK, left))
                sha.update(chunk)
                md5.update(chunk)
                out.write(chunk)
                left -= len(chunk)
        return SeedFile(f.rel, f.size, sha.hexdigest(), md5.digest())

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        files = list(pool.map(write, enumerate(ds.files)))
    return Dataset(ds.name, ds.prefix, files, folder)


def seed(container: ContainerClient, ds: Dataset, threads: int = 16) -> None:
    """Upload the local copies of `ds` to `container`, 16 blobs at a time and each
    large blob in 16 parallel blocks."""
    local = ds.local
    assert local is not None

    def put(f: SeedFile) -> None:
        with open(local / f.rel, "rb") as data:
            container.upload_blob(
                ds.blob_name(f.rel), data, length=f.size, overwrite=True, max_concurrency=16
            )

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, ds.files))


# -- checks -------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_tree(dest: Path, ds: Dataset, tolerate: frozenset[str] = frozenset()) -> list[str]:
    """Problems with the files under `dest` against `ds`: missing, extra (a leftover
    partial file counts; the paths in `tolerate` do not), wrong size, wrong sha256.
    Empty means every byte matches."""
    found = {
        str(Path(top, name).relative_to(dest)) for top, _, names in os.walk(dest) for name in names
    } - tolerate
    expected = {f.rel: f for f in ds.files}
    problems = [f"missing {rel}" for rel in sorted(expected.keys() - found)]
    problems += [f"unexpected file {rel}" for rel in sorted(found - expected.keys())]

    def check(f: SeedFile) -> str | None:
        path = dest / f.rel
        if (size := path.stat().st_size) != f.size:
            return f"{f.rel}: {size} bytes, expected {f.size}"
        return None if sha256_file(path) == f.sha256 else f"{f.rel}: sha256 differs"

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        present = [expected[rel] for rel in sorted(expected.keys() & found)]
        problems += [p for p in pool.map(check, present) if p]
    return problems


def verify_listing(container: ContainerClient, prefix: str, ds: Dataset) -> list[str]:
    """Problems with the blobs under `prefix` against `ds`: names, sizes, and the
    Content-MD5 where the service recorded one."""
    listed = {b.name[len(prefix) :]: b for b in container.list_blobs(name_starts_with=prefix)}
    expected = {f.rel: f for f in ds.files}
    problems = [f"missing blob {rel}" for rel in sorted(expected.keys() - listed.keys())]
    problems += [f"unexpected blob {rel}" for rel in sorted(listed.keys() - expected.keys())]
    for rel in sorted(expected.keys() & listed.keys()):
        blob, f = listed[rel], expected[rel]
        md5 = blob.content_settings.content_md5
        if blob.size != f.size:
            problems.append(f"{rel}: {blob.size} bytes, expected {f.size}")
        elif md5 and bytes(md5) != f.md5:
            problems.append(f"{rel}: Content-MD5 differs")
    return problems


# -- measuring one contender ---------------------------------------------------


@dataclass
class Run:
    """One contender run: wall seconds, CPU seconds (user + sys), peak RSS, outcome."""

    seconds: float
    cpu: float
    rss_mib: float
    ok: bool
    note: str = ""
    stdout: str = ""
    server_cpu: float | None = None  # Azurite's CPU seconds during the run, where measured


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark dies, even by SIGKILL."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def measure(argv: Sequence[str], env: dict[str, str], timeout: float) -> Run:
    """Run `argv` through the _rusage.py launcher, which reaps it with os.wait4 and
    reports its own wall time, CPU and peak RSS (see there why not from here). The
    launcher leads a new process group: on timeout or interrupt the whole group dies."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "rusage.json")
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(RUSAGE), str(report), "--", *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError):  # also anything it left behind
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        text = out.read_text(errors="replace")
        lines = err.read_text(errors="replace").strip().splitlines()
        usage = json.loads(report.read_text()) if report.exists() else {}
    seconds = usage.get("seconds", 0.0)
    cpu = usage.get("cpu", 0.0)
    rss = usage.get("maxrss_kib", 0) / 1024
    if timed_out:
        return Run(timeout, cpu, rss, False, f"timed out after {timeout:.0f} s", text)
    if proc.returncode != 0 or not usage:
        last = lines[-1] if lines else "(no output)"
        return Run(seconds, cpu, rss, False, f"exit {proc.returncode}: {last}", text)
    return Run(seconds, cpu, rss, True, "", text)


def best_of(runs: list[Run]) -> Run | None:
    """The fastest successful run, with the highest peak RSS seen across runs
    (memory bounds hold on every run, not the luckiest); None if a run failed."""
    if not runs or not all(r.ok for r in runs):
        return None
    best = min(runs, key=lambda r: r.seconds)
    rss = max(r.rss_mib for r in runs)
    return Run(best.seconds, best.cpu, rss, True, best.note, server_cpu=best.server_cpu)


# -- reporting ------------------------------------------------------------------


def print_table(title: str, total: int, rows: Sequence[tuple[str, Run | None, str]]) -> None:
    """One table: contender, seconds, MB/s, CPU s, CPU s per GiB moved (TLS's cost shows
    there, HTTPS against --http), peak RSS MiB, Azurite's CPU s
    during the run (when measured: whether the server was the bottleneck), and a
    note (rows whose run is None failed; the note says why)."""
    server = any(run is not None and run.server_cpu is not None for _, run, _ in rows)
    srv_head = f" {'Azurite CPU s':>13}" if server else ""
    print(f"  {title}")
    print(
        f"  {'contender':<10} {'seconds':>8} {'MB/s':>8} {'CPU s':>7} {'s/GiB':>6} {'RSS MiB':>8}"
        f"{srv_head}  check"
    )
    for name, run, note in rows:
        note = note if len(note) <= 100 else note[:97] + "..."
        if run is None:
            srv = f" {'-':>13}" if server else ""
            print(f"  {name:<10} {'-':>8} {'-':>8} {'-':>7} {'-':>6} {'-':>8}{srv}  {note}")
            continue
        rate, per_gib = total / run.seconds / MB, run.cpu / (total / (1 << 30))
        srv = ""
        if server:
            srv = f" {'-':>13}" if run.server_cpu is None else f" {run.server_cpu:13.2f}"
        print(
            f"  {name:<10} {run.seconds:8.2f} {rate:8.1f} {run.cpu:7.2f} {per_gib:6.2f}"
            f" {run.rss_mib:8.1f}"
            f"{srv}  {note}"
        )


def write_record(benchmark: str, rows: Sequence[dict[str, Any]], **about: Any) -> Path:
    """Write this run's record, benchmarks/records/<UTC time>-<benchmark>.json: the commit,
    the date, the machine, `about` (options, transport...) and `rows` (workload, tool,
    rate, unit, cpu_s, ...), each given its `ratio`: datamount's rate over the row's on
    the same workload. `scripts/gendocs.py` puts the newest one in docs/benchmarks.md."""

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return run.stdout.strip() if run.returncode == 0 else ""

    ours = {r["workload"]: r for r in rows if r["tool"] == "datamount" and r.get("rate")}
    for row in rows:
        mine = ours.get(row["workload"])
        same = mine is not None and row.get("rate") and mine.get("unit") == row.get("unit")
        row["ratio"] = round(mine["rate"] / row["rate"], 2) if mine and same else None
    memory = 0
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as info:
        memory = int(info.readline().split()[1]) // 1024  # MemTotal, kB
    now = datetime.now(UTC).replace(microsecond=0)
    record = {
        "benchmark": benchmark,
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "date": now.isoformat(),
        "machine": {
            "cores": os.cpu_count(),
            "memory_mib": memory or None,
            "kernel": platform.release(),
        },
        **about,
        "rows": list(rows),
    }
    path = RECORDS / f"{now:%Y%m%dT%H%M%SZ}-{benchmark}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=str) + "\n")
    print(f"record: {path} (scripts/gendocs.py puts it in docs/benchmarks.md)")
    return path


# -- additions for the mount benchmark ----------------------------------------------


def listing_dataset(scale: float = 1.0) -> Dataset:
    """L: 20,000 tiny files in one folder (the listing test). `scale` shrinks the count
    but never below 6,000, so the folder still spans two 5,000-entry listing pages."""
    count = max(6000, round(20000 * scale))
    return Dataset("L", "L/", [SeedFile(f"t{i:05d}.txt", len(_tiny(i))) for i in range(count)])


def _tiny(index: int) -> bytes:
    return f"tiny file {index:05d}\n".encode()


def seed_tiny(
    azurite: BenchAzurite, container: str, sas: str, ds: Dataset, threads: int = 32
) -> None:
    """Put every file of a listing dataset: bare SAS-signed PUTs on keep-alive
    connections, `threads` at a time (the SDK's per-call CPU would make 20,000 tiny
    uploads take minutes on two cores). `sas` needs create and write permission."""
    from urllib.parse import quote, urlsplit

    url = urlsplit(azurite.endpoint)
    base = f"{url.path.rstrip('/')}/{container}/"
    work = [(i, ds.blob_name(f.rel)) for i, f in enumerate(ds.files)]  # in index order
    shards = [work[i::threads] for i in range(threads)]

    def put(shard: list[tuple[int, str]]) -> None:
        cafile = str(azurite.tls.ca) if azurite.tls else None
        conn = connection(url, timeout=60, cafile=cafile)
        headers = {"x-ms-blob-type": "BlockBlob", "Content-Type": "text/plain"}
        try:
            for index, name in shard:
                conn.request("PUT", f"{base}{quote(name)}?{sas}", _tiny(index), headers)
                resp = conn.getresponse()
                if resp.status != 201:
                    raise RuntimeError(f"PUT {name}: HTTP {resp.status} {resp.read()[:200]!r}")
                resp.read()
        finally:
            conn.close()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, shards))


def azurite_bytes_sent(azurite: BenchAzurite) -> int:
    """Bytes Azurite has written to its sockets so far (/proc/<pid>/io wchar; it runs
    with --silent, so nothing else): every byte a contender fetched, headers included."""
    proc = azurite._proc
    if proc is None:
        return 0
    with open(f"/proc/{proc.pid}/io") as io:
        fields = dict(line.split(": ") for line in io.read().splitlines())
    return int(fields["wchar"])


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all its threads (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_peak_rss_mib(pid: int, reset: bool = False) -> float:
    """VmHWM of `pid` in MiB; with `reset`, first restart the high-water mark from the
    current RSS (writing 5 to /proc/<pid>/clear_refs, Linux 4.0+, as owner or root)."""
    if reset:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def drop_page_cache(path: Path) -> None:
    """Evict `path`'s pages from the page cache (dirty pages are written first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def mounted(mountpoint: Path) -> bool:
    """`mountpoint` is in /proc/mounts (whatever answers there)."""
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == str(mountpoint) for line in mounts)


def alive(pid: int) -> bool:
    """Process `pid` exists and is not a zombie (a reparented daemon may stay one)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the clean-up inside is done, then interrupt."""
    deferred = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, deferred)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, deferred)


def detach_leftovers(workdir: Path) -> None:
    """Detach (fusermount3 -uz) every mount still under `workdir`, with a warning each."""
    with open("/proc/mounts") as mounts:
        for mp in [m.split()[1] for m in mounts if m.split()[1].startswith(str(workdir))]:
            print(f"warning: {mp} was still mounted: detaching it", file=sys.stderr)
            subprocess.run(["fusermount3", "-uz", mp], capture_output=True, timeout=30)


def end_mount(mountpoint: Path, pids: set[int], unmount: Sequence[str] = (), **run: Any) -> None:
    """Take a FUSE mount down and end the processes serving it: the `unmount` command
    first if given (15 s for `pids` to exit after it), then SIGTERM (10 s), then
    `fusermount3 -uz` if still mounted and SIGKILL for whatever still runs."""

    def wait_gone(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while any(map(alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)

    if unmount and mounted(mountpoint):
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run(unmount, capture_output=True, timeout=60, **run)
        wait_gone(15)
    for sig, seconds in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if sig == signal.SIGKILL and mounted(mountpoint):
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True, timeout=30)
        for pid in filter(alive, pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        wait_gone(seconds)
