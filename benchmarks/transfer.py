"""`make bench`: datamount's download and upload against baselines, side by side on
the same machine and the same data, in one run, reported as ratios. Each run ends by
writing its record to benchmarks/records/ (_common.write_record).

Datasets (seeded random bytes, sha256 and md5 recorded at seeding): A one 1 GiB
blob, B 2,000 x 256 KiB blobs in 20 folders, C 10 x 100 MiB blobs.

Download contenders, each its own subprocess started through benchmarks/_rusage.py
(so wall time, CPU and peak RSS are its own; see there why not straight from here),
each into a fresh empty folder on local disk, dropped afterwards:
  limit      16 threads of keep-alive, SAS-signed ranged GETs that discard the bytes
  datamount  `datamount download URI DEST --workspace WS`
  sdk        azure-storage-blob download_blob(max_concurrency=16), 16 blobs at a time
  adlfs      AzureBlobFileSystem.get(remote, local, recursive=True)
  rclone     `rclone copy` (16 transfers), when rclone is installed
After each download table: every contender's CPU per GiB and per 1,000 files, and one
more datamount download under py-spy for its GIL-held share and projected ceiling
(benchmarks/_gil.py; --no-gil skips it).
Every file written is checked against the seeded sha256 (the limit: its byte count);
datamount's resume manifest in DEST is tolerated and reported. Wall times include
each contender's start-up (interpreter, imports), printed first.

Upload contenders: `datamount upload SRC URI --workspace WS` and the SDK's
upload_blob(max_concurrency=16), 16 files at a time, from the local copies. Each
upload run gets a fresh in-memory Azurite: Azurite keeps every blob in RAM and only
frees overwritten or deleted ones in a GC pass every 10 minutes, so uploads into the
download Azurite would grow it by the dataset size per run (measured: 2 GiB seeded
= 2.1 GiB RSS, overwritten once = 4.0 GiB). Checked by listing names, sizes and
Content-MD5 where set.

Over HTTPS by default (Azurite serving a throwaway CA's leaf certificate, trusted by
every contender through SSL_CERT_FILE / REQUESTS_CA_BUNDLE); `--http` for plain HTTP.
The table's CPU s/GiB column is each contender's CPU per GiB moved: what TLS costs
the client shows as the difference between the two modes.

Usage: benchmarks/transfer.py [--datasets A,B,C] [--repeat N] [--only download|upload]
                              [--scale 0.1] [--keep] [--http] [--no-gil]
Exit 0 when every contender ran and every byte checked out (targets are reported,
not enforced); 1 otherwise; 130 when interrupted (Ctrl-C or SIGTERM: Azurite and the
running contender are stopped, the work folder dropped). Single-threaded; imports the
benchmark helpers and the SDK (for SAS tokens), never datamount.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import _gil
import _scale
from _common import (
    MB,
    BenchAzurite,
    Dataset,
    Run,
    best_of,
    certs_for,
    make_local,
    measure,
    print_table,
    seed,
    standard_datasets,
    verify_listing,
    verify_tree,
    write_record,
)
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

STORE = "bench"  # the datastore of the generated workspace, and its container
PYTHON = sys.executable
WORKERS = str(Path(__file__).with_name("_workers.py"))
DATAMOUNT = str(Path(sys.executable).parent / "datamount")
RCLONE = shutil.which("rclone")  # a contender when installed (rclone copy)
DOWNLOADERS = ("limit", "datamount", *(("rclone",) if RCLONE else ()), "sdk", "adlfs")
UPLOADERS = ("datamount", "sdk")
# Targets for datamount, as throughput ratios.
LIMIT_TARGET = {"A": 0.85, "B": 0.9, "C": 0.85}
SDK_DOWNLOAD_TARGET = 2.0
SDK_UPLOAD_TARGET = 1.5
RCLONE_SMALL_TARGET = 1.2  # issue 16: the small-file download >= 1.2 x rclone copy
RSS_TARGET_MIB = 200.0
# datamount's resume manifest stays in DEST by design (src/datamount/transfer/downloader.py):
# tolerated by the byte check, and reported once in the summary.
DATAMOUNT_MANIFEST = ".datamount-manifest.jsonl"


class Bench:
    """Options and the running tally of one benchmark run."""

    def __init__(self, opts: argparse.Namespace, workdir: Path) -> None:
        self.repeat: int = opts.repeat
        self.keep: bool = opts.keep
        self.workdir = workdir
        self.failures: list[str] = []
        self.notes: set[str] = set()
        self.certs = certs_for(workdir, opts.http)
        self.gil: bool = opts.gil
        self.rows: list[dict] = []  # every table's rows, for the run's record

    def scratch(self, label: str) -> Path:
        """A fresh folder for one run: DEST and datamount's cache/log folders live in it."""
        return Path(tempfile.mkdtemp(prefix=f"{label}-", dir=self.workdir))

    def drop(self, path: Path) -> None:
        if not self.keep:
            shutil.rmtree(path, ignore_errors=True)


def write_workspace(path: Path, azurite: BenchAzurite, port: int = 0) -> Path:
    """A workspace with one datastore `bench` on `azurite` (through the delay
    line on `port`, when given); the key by env reference."""
    endpoint = azurite.endpoint.replace(f":{azurite.port}/", f":{port}/") if port else None
    path.write_text(
        "datastores:\n"
        f"  {STORE}:\n"
        "    type: azure_blob\n"
        f"    account_name: {azurite.account}\n"
        f"    container_name: {STORE}\n"
        f"    endpoint: {endpoint or azurite.endpoint}\n"
        '    credentials: {account_key: "${AZURITE_ACCOUNT_KEY}"}\n'
    )
    return path


def contender_env(azurite: BenchAzurite, scratch: Path) -> dict[str, str]:
    """The environment of one contender run: secrets by variable, never argv."""
    sas = generate_container_sas(
        azurite.account,
        STORE,
        account_key=azurite.key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.now(UTC) + timedelta(days=1),
    )
    return {
        **os.environ,
        "AZURITE_ACCOUNT_KEY": azurite.key,
        "BENCH_CONNECTION_STRING": azurite.connection_string,
        "BENCH_SAS": sas,
        "DATAMOUNT_CACHE_DIR": str(scratch / "cache"),
        "DATAMOUNT_LOG_DIR": str(scratch / "logs"),
        **azurite.trust_env(),
    }


def timeout_for(ds: Dataset) -> float:
    return 120 + ds.total / (5 * MB)  # 5 MB/s is far below any contender here


def download_argv(name: str, ds: Dataset, azurite: BenchAzurite, ws: Path, dest: Path) -> list:
    file_flag = ["--file"] if ds.is_file else []
    if name == "datamount":
        uri = f"azureml://datastores/{STORE}/paths/{ds.prefix}"
        return [DATAMOUNT, "download", uri, str(dest), "--workspace", str(ws)]
    if name == "limit":
        return [PYTHON, WORKERS, "limit-read", azurite.endpoint, STORE, ds.prefix, *file_flag]
    if name == "rclone":  # the emulator's well-known key (no secret), our endpoint URL
        return ["rclone", "copy", f":azureblob:{STORE}/{ds.prefix}".rstrip("/"), str(dest),
                "--azureblob-use-emulator", "--azureblob-endpoint", azurite.endpoint,
                "--transfers", "16", "--multi-thread-streams", "8"]  # fmt: skip
    return [PYTHON, WORKERS, f"{name}-download", STORE, ds.prefix, str(dest), *file_flag]


def check_download(bench: Bench, name: str, run: Run, ds: Dataset, dest: Path) -> list[str]:
    """Every byte for the writers; the byte count for the limit reader."""
    if name == "datamount" and (dest / DATAMOUNT_MANIFEST).exists():
        bench.notes.add(f"datamount leaves its resume manifest {DATAMOUNT_MANIFEST} in DEST")
        return verify_tree(dest, ds, frozenset({DATAMOUNT_MANIFEST}))
    if name != "limit":
        return verify_tree(dest, ds)
    try:
        got = json.loads(run.stdout.strip().splitlines()[-1])["bytes"]
    except (ValueError, IndexError, KeyError):
        return [f"no byte count in the limit reader's output: {run.stdout[-200:]!r}"]
    return [] if got == ds.total else [f"read {got} bytes, expected {ds.total}"]


def record(
    bench: Bench, label: str, name: str, rep: int, run: Run, problems: list[str]
) -> str | None:
    """Print one run's progress line; return why it failed, or None."""
    head = f"  {label:<11} {name:<10} run {rep + 1}/{bench.repeat}"
    if run.ok and not problems:
        print(f"{head} {run.seconds:7.2f} s  ok", flush=True)
        return None
    why = run.note if not run.ok else f"{len(problems)} problem(s), first: {problems[0]}"
    print(f"{head} FAIL {why if len(why) <= 100 else why[:97] + '...'}", flush=True)
    bench.failures.append(f"{label} {name}: {why}")
    return why


Attempt = Callable[[str, int, Path], tuple[Run, list[str]]]


def contest(
    bench: Bench, label: str, names: tuple[str, ...], attempt: Attempt, total: int
) -> dict[str, Run | None]:
    """Run each contender `repeat` times, round-robin so drift hits all alike, each in a
    fresh scratch folder; a contender that fails once is out. Prints the table;
    returns each contender's best run (None: failed).

    The scratch folders are dropped only after the last run of the dataset, not after
    each run: on an ext4 without a journal (this VM's root) the inode allocator skips
    every inode freed in the last 60-360 s (ext4's `recently_deleted`), so a run that
    creates 2,000 files right after another contender's 2,000 were deleted pays for
    that deletion (perf: `find_inode_bit` + `recently_deleted` + `find_get_block` were
    ~40% of such a datamount run's CPU; its kernel CPU went from 0.4 s on a fresh
    filesystem to 1.5-2.6 s)."""
    runs: dict[str, list[Run]] = {name: [] for name in names}
    failed: dict[str, tuple[str, Run]] = {}
    scratches: list[Path] = []
    try:
        for rep in range(bench.repeat):
            for name in names:
                if name in failed:
                    continue
                scratch = bench.scratch(f"{label.replace(' ', '-')}-{name}")
                scratches.append(scratch)
                os.sync()  # the previous run's dirty pages are not this run's cost
                run, problems = attempt(name, rep, scratch)
                if why := record(bench, label, name, rep, run, problems):
                    failed[name] = (why, run)
                else:
                    runs[name].append(run)
    finally:
        for scratch in scratches:
            bench.drop(scratch)
    best = {name: None if name in failed else best_of(runs[name]) for name in names}
    rows = []
    for name in names:  # a run that finished but failed its check still shows its figures
        why, bad = failed.get(name, ("", None))
        shown = best[name] or (bad if bad and bad.ok else None)
        rows.append((name, shown, f"FAIL {why}" if why else "ok"))
    print_table(f"best of {bench.repeat}:", total, rows)
    return best


def measured(azurite: BenchAzurite, argv: list[str], env: dict[str, str], timeout: float) -> Run:
    """measure(), plus the CPU seconds Azurite spent meanwhile: a server near one
    core per wall second (Node serves requests on one thread, with GC and I/O
    threads beside it) is the bottleneck, whichever client drives it."""
    before = azurite.cpu_seconds()
    run = measure(argv, env, timeout)
    return dataclasses.replace(run, server_cpu=azurite.cpu_seconds() - before)


def bench_download(bench: Bench, azurite: BenchAzurite, ws: Path, ds: Dataset) -> None:
    """Every download contender on `ds`, then the ratios and targets."""

    def attempt(name: str, rep: int, scratch: Path) -> tuple[Run, list[str]]:
        dest = scratch / "dest"
        dest.mkdir()
        argv = download_argv(name, ds, azurite, ws, dest)
        run = measured(azurite, argv, contender_env(azurite, scratch), timeout_for(ds))
        return run, check_download(bench, name, run, ds, dest) if run.ok else []

    print(f"\ndownload {ds.name}: {ds.describe()}")
    best = contest(bench, f"download {ds.name}", DOWNLOADERS, attempt, ds.total)
    bench.rows += record_rows(f"download {ds.name}: {ds.describe()}", best, ds.total)
    dm = best["datamount"]
    gil = gil_run(bench, azurite, ws, ds) if bench.gil and dm else None
    _scale.print_download(ds, best, gil)
    print_ratios({n: best[n] for n in DOWNLOADERS if n != "datamount"}, dm)
    limit_goal = ("limit", best["limit"], LIMIT_TARGET[ds.name])
    goals = [limit_goal, ("SDK", best["sdk"], SDK_DOWNLOAD_TARGET)]
    if ds.name == "B" and "rclone" in best:  # issue 16: small files >= 1.2 x rclone copy
        goals.append(("rclone copy", best["rclone"], RCLONE_SMALL_TARGET))
    print_targets(dm, goals)


def gil_run(
    bench: Bench, azurite: BenchAzurite, ws: Path, ds: Dataset
) -> tuple[Run, _gil.GilSample] | None:
    """One more `datamount download` of `ds`, under py-spy (which starts it, so its
    whole life is sampled): its run (py-spy's CPU included: not for the tables) and
    GIL samples. None when py-spy is missing or the run failed (said in one line)."""
    if not _gil.pyspy():
        print("  GIL: n/a (py-spy not installed)")
        return None
    scratch = bench.scratch(f"gil-{ds.name}")
    try:
        (dest := scratch / "dest").mkdir()
        os.sync()
        raw = scratch / "gil.raw"
        argv = _gil.wrapped(download_argv("datamount", ds, azurite, ws, dest), raw)
        run = measure(argv, contender_env(azurite, scratch), timeout_for(ds))
        sample = _gil.read_wrapped(raw)
        if not run.ok or not sample.ok:
            print(f"  GIL: n/a ({run.note or sample.error})")
            return None
        return run, sample
    finally:
        bench.drop(scratch)


def bench_upload(bench: Bench, ds: Dataset) -> None:
    """Every upload contender from the local copies of `ds`, each run into a fresh
    Azurite and a fresh prefix, then the ratio and targets."""
    src = str(ds.local)

    def attempt(name: str, rep: int, scratch: Path) -> tuple[Run, list[str]]:
        azurite = BenchAzurite(scratch / "azurite", tls=bench.certs)
        try:
            azurite.start()
            container = azurite.create_container(STORE)
            ws = write_workspace(scratch / "workspace.yaml", azurite)
            prefix = f"up-{name}-{rep}/{ds.name}/"
            if name == "datamount":
                uri = f"azureml://datastores/{STORE}/paths/{prefix}"
                argv = [DATAMOUNT, "upload", src, uri, "--workspace", str(ws)]
            else:
                argv = [PYTHON, WORKERS, "sdk-upload", src, STORE, prefix]
            run = measured(azurite, argv, contender_env(azurite, scratch), timeout_for(ds))
            return run, verify_listing(container, prefix, ds) if run.ok else []
        finally:
            azurite.stop()

    print(f"\nupload {ds.name}: {ds.describe()}")
    best = contest(bench, f"upload {ds.name}", UPLOADERS, attempt, ds.total)
    bench.rows += record_rows(f"upload {ds.name}: {ds.describe()}", best, ds.total)
    print_ratios({"sdk": best["sdk"]}, best["datamount"])
    print_targets(best["datamount"], [("SDK", best["sdk"], SDK_UPLOAD_TARGET)])


def record_rows(workload: str, best: dict[str, Run | None], total: int) -> list[dict]:
    """One table's rows for the run's record; a contender that failed has no rate."""
    return [
        {"workload": workload, "tool": name, "rate": round(total / run.seconds / MB, 1),
         "unit": "MB/s", "cpu_s": round(run.cpu, 2), "rss_mib": round(run.rss_mib, 1)}
        if run else {"workload": workload, "tool": name, "rate": None, "note": "failed"}
        for name, run in best.items()
    ]  # fmt: skip


def speedup(dm: Run | None, other: Run | None) -> float | None:
    """datamount's throughput over `other`'s (same bytes: the inverse ratio of seconds)."""
    return other.seconds / dm.seconds if dm and other else None


def print_ratios(others: dict[str, Run | None], dm: Run | None) -> None:
    parts = []
    for name, run in others.items():
        ratio = speedup(dm, run)
        label = "SDK" if name == "sdk" else name
        parts.append(f"datamount/{label} {ratio:.2f}" if ratio else f"datamount/{label} n/a")
    print("  ratios (throughput): " + ", ".join(parts))


def print_targets(dm: Run | None, goals: list[tuple[str, Run | None, float]]) -> None:
    """PASS/FAIL per target; n/a when datamount or the baseline did not run."""
    print("  targets:")
    for label, run, factor in goals:
        ratio = speedup(dm, run)
        mark = "n/a " if ratio is None else "PASS" if ratio >= factor else "FAIL"
        got = "" if ratio is None else f" (got {ratio:.2f})"
        print(f"    [{mark}] datamount >= {factor:g} x {label}{got}")
    mark = "n/a " if dm is None else "PASS" if dm.rss_mib <= RSS_TARGET_MIB else "FAIL"
    got = "" if dm is None else f" (got {dm.rss_mib:.1f})"
    print(f"    [{mark}] datamount peak RSS <= {RSS_TARGET_MIB:g} MiB{got}")


def print_startup() -> None:
    """Each contender's fixed start-up cost (interpreter and imports), which every wall
    time includes: it weighs on short runs, so read --scale 0.1 ratios with it in mind."""
    commands = {
        "limit": [PYTHON, "-c", "import http.client, xml.etree.ElementTree"],
        "datamount --version": [DATAMOUNT, "--version"],
        "sdk": [PYTHON, "-c", "import azure.storage.blob"],
        "adlfs": [PYTHON, "-c", "import adlfs"],
    }
    parts = []
    for name, argv in commands.items():
        best = best_of([measure(argv, dict(os.environ), 60) for _ in range(3)])
        parts.append(f"{name} {best.seconds:.2f} s" if best else f"{name} n/a")
    print("start-up, best of 3 (inside every wall time below): " + ", ".join(parts))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default="A,B,C", help="comma-separated: A, B, C")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs (default 1)")
    parser.add_argument("--only", choices=("download", "upload"), help="one direction only")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink datasets, e.g. 0.1")
    parser.add_argument("--http", action="store_true", help="plain HTTP (default: HTTPS)")
    parser.add_argument(
        "--no-gil", dest="gil", action="store_false", help="no py-spy run (GIL figures n/a)"
    )
    opts = parser.parse_args(argv)
    opts.datasets = [d.strip().upper() for d in opts.datasets.split(",") if d.strip()]
    unknown = set(opts.datasets) - set("ABC")
    if unknown or not opts.datasets or opts.repeat < 1 or not 0 < opts.scale <= 1:
        parser.error("--datasets takes A, B, C; --repeat >= 1; 0 < --scale <= 1")
    return opts


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM runs the same clean-up as Ctrl-C


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="datamount-bench-"))
    bench = Bench(opts, workdir)
    azurite = BenchAzurite(workdir / "azurite", tls=bench.certs)
    all_sets = standard_datasets(opts.scale)
    print(
        f"datamount transfer benchmark: {os.cpu_count()} cores, Python {platform.python_version()}"
        f", scale {opts.scale:g}, best of {opts.repeat}, over {'HTTP' if opts.http else 'HTTPS'}"
        f", work folder {workdir}"
    )
    load = os.getloadavg()[0]
    if load > 0.5:  # two cores: anything else running skews every figure below
        print(f"warning: load average {load:.2f} before start; other processes share the CPUs")
    if not Path(DATAMOUNT).exists():
        print(f"note: {DATAMOUNT} is missing; datamount's rows will fail (run `make setup`)")
    try:
        print_startup()
        start = time.perf_counter()
        sets = [make_local(all_sets[name], workdir / "src") for name in opts.datasets]
        print(f"local copies written and hashed in {time.perf_counter() - start:.1f} s")
        if opts.only != "upload":
            azurite.start()
            container = azurite.create_container(STORE)
            start = time.perf_counter()
            for ds in sets:
                seed(container, ds)
            rss, _ = azurite.memory_mib()
            total = sum(ds.total for ds in sets) / MB
            print(
                f"seeded {total:,.0f} MB into Azurite (in memory, {azurite.endpoint}) in "
                f"{time.perf_counter() - start:.1f} s; Azurite RSS {rss:,.0f} MiB"
            )
            ws = write_workspace(workdir / "workspace.yaml", azurite)
            for ds in sets:
                bench_download(bench, azurite, ws, ds)
            print(f"\nAzurite peak RSS {azurite.memory_mib()[1]:,.0f} MiB")
        if opts.only != "download":
            for ds in sets:
                bench_upload(bench, ds)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        azurite.stop()
        if opts.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print("\nMB/s is 10^6 bytes per second; ratios are datamount's throughput over the other's.")
    load = os.getloadavg()[0]
    print(f"load average at the end: {load:.2f} (above 1: other work shared the CPUs)")
    for note in sorted(bench.notes):
        print(f"note: {note}")
    if bench.rows:
        transport = "HTTP" if opts.http else "HTTPS"
        write_record("transfer", bench.rows, transport=transport, options=vars(opts),
                     load_average_end=round(load, 2), failures=bench.failures)  # fmt: skip
    if bench.failures:
        print(f"{len(bench.failures)} failure(s):\n  " + "\n  ".join(bench.failures))
        if not opts.keep:
            print("(rerun with --keep to keep the work folder, datamount's logs included)")
        return 1
    print("all contenders ran and every byte checked out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
