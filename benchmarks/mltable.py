"""`make bench`: MLTable reading speed, datamount against Azure ML's own `mltable`.

Tables (seeded, reproducible): `csv`, 4 delimited files of ~50 MB each (an int, a
text, a float, a 0/1 flag and a date column; 200 MB in all), and `parquet`, the
same rows as 4 parquet files; each folder holds an MLTable (`pattern: ./*.csv`
with `read_delimited`, `pattern: ./*.parquet` with `read_parquet`). `--scale`
shrinks the row count.

Contenders, each its own subprocess started through benchmarks/_rusage.py (wall
time, CPU seconds, peak RSS its own; start-up and imports included), each
running `load(...).to_pandas_dataframe()` and printing the row count (checked):
  dm-azurite  datamount's load over Azurite (azureml://datastores/bench/...)
  dm-local    datamount's load of the local copies
  mltable     Azure ML's mltable.load of the local copies (it cannot reach Azurite
              through datamount's workspace: it only knows Azure ML's services)
Ratios are mltable's seconds over datamount's (above 1: datamount faster; the
target is at least 1 for both).

Over HTTPS by default (Azurite serving a throwaway CA's leaf certificate, trusted
through SSL_CERT_FILE / REQUESTS_CA_BUNDLE); `--http` for plain HTTP.

Usage: benchmarks/mltable.py [--scale 0.2] [--repeat N] [--tables csv,parquet]
                             [--keep] [--http]
Exit 0 when every contender ran and returned every row; 1 otherwise; 130 when
interrupted (Azurite stopped, the work folder dropped). Single-threaded; imports
the benchmark helpers and pyarrow (to write the data), never datamount.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from _common import (
    BenchAzurite,
    Dataset,
    Run,
    SeedFile,
    best_of,
    certs_for,
    measure,
    print_table,
    seed,
)
from transfer import STORE, write_workspace

FILES = 4
ROWS_PER_FILE = 1_250_000  # ~50 MB of CSV each at scale 1
TABLES = {"csv": ("*.csv", "read_delimited"), "parquet": ("*.parquet", "read_parquet")}
CONTENDERS = ("dm-azurite", "dm-local", "mltable")

READ = """
import sys
kind, target = sys.argv[1], sys.argv[2]
if kind == "mltable":
    import mltable
    frame = mltable.load(target).to_pandas_dataframe()
else:
    from datamount.mltable import load
    frame = load(target, sys.argv[3] if len(sys.argv) > 3 else None).to_pandas_dataframe()
print(len(frame))
"""


def write_tables(root: Path, scale: float) -> tuple[dict[str, Dataset], int]:
    """The csv and parquet tables under root/<name>/ with their MLTable files,
    and the row count of each."""
    rows = max(1000, int(ROWS_PER_FILE * scale))
    names = np.array(["ann", "bob", "cy", "dee", "eve-marie", "fritz", "gül", "hana"])
    sets: dict[str, Dataset] = {}
    for name, (pattern, read) in TABLES.items():
        folder = root / name
        folder.mkdir(parents=True)
        files = []
        for i in range(FILES):
            rng = np.random.default_rng(i)
            days = np.datetime64("2020-01-01") + rng.integers(0, 2000, rows).astype(
                "timedelta64[D]"
            )
            table = pa.table({
                "id": np.arange(i * rows, (i + 1) * rows, dtype=np.int64),
                "name": pa.array(names[rng.integers(0, len(names), rows)]),
                "score": np.round(rng.random(rows) * 1000, 3),
                "flag": rng.integers(0, 2, rows),
                "day": pa.array(days.astype("datetime64[s]")),
            })  # fmt: skip
            rel = f"part-{i:02d}.{name}"
            if name == "csv":
                pacsv.write_csv(table, folder / rel)
            else:
                pq.write_table(table, folder / rel, row_group_size=256 * 1024)
            files.append(SeedFile(rel, (folder / rel).stat().st_size))
        text = f"paths:\n  - pattern: ./{pattern}\ntransformations:\n  - {read}\n"
        (folder / "MLTable").write_text(text)
        files.append(SeedFile("MLTable", len(text)))
        sets[name] = Dataset(name, f"{name}/", files, folder)
    return sets, rows * FILES


def argv_for(contender: str, ds: Dataset, ws: Path) -> list[str]:
    assert ds.local is not None
    if contender == "dm-azurite":
        target = f"azureml://datastores/{STORE}/paths/{ds.prefix}"
        return [sys.executable, "-P", "-c", READ, "datamount", target, str(ws)]
    kind = contender.split("/")[0]
    return [sys.executable, "-P", "-c", READ, kind, str(ds.local)]


def bench_table(
    ds: Dataset, rows: int, azurite: BenchAzurite, ws: Path, opts: argparse.Namespace
) -> list[str]:
    env = {**os.environ, "AZURITE_ACCOUNT_KEY": azurite.key, **azurite.trust_env()}
    total = sum(f.size for f in ds.files)
    results: dict[str, Run | None] = {}
    failures, notes = [], {}
    for contender in CONTENDERS:
        runs = [measure(argv_for(contender, ds, ws), env, 600) for _ in range(opts.repeat)]
        bad = [r for r in runs if not r.ok or r.stdout.strip().splitlines()[-1:] != [str(rows)]]
        if bad:
            why = bad[0].note or f"{bad[0].stdout.strip()[-80:]!r} rows, expected {rows}"
            failures.append(f"{ds.name} {contender}: {why}")
            notes[contender] = why
            results[contender] = None
        else:
            results[contender] = best_of(runs)
            notes[contender] = f"{rows:,} rows"
    real = results["mltable"]
    for contender in ("dm-azurite", "dm-local"):
        ours = results[contender]
        if ours is not None and real is not None:
            notes[contender] += f"; mltable {real.seconds / ours.seconds:.2f}x its time"
    print()
    print_table(
        f"{ds.name}: {ds.describe()}, load(...).to_pandas_dataframe()",
        total,
        [(c, results[c], notes[c]) for c in CONTENDERS],
    )
    return failures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="csv,parquet", help="comma-separated: csv, parquet")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs (default 1)")
    parser.add_argument("--scale", type=float, default=1.0, help="shrink the rows, e.g. 0.2")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--http", action="store_true", help="plain HTTP (default: HTTPS)")
    opts = parser.parse_args(argv)
    opts.tables = [t for t in opts.tables.split(",") if t]
    if set(opts.tables) - set(TABLES) or opts.repeat < 1 or not 0 < opts.scale <= 1:
        parser.error("--tables takes csv, parquet; --repeat >= 1; 0 < --scale <= 1")
    return opts


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    workdir = Path(tempfile.mkdtemp(prefix="datamount-bench-mltable-"))
    azurite = BenchAzurite(workdir / "azurite", tls=certs_for(workdir, opts.http))
    print(
        f"datamount MLTable benchmark: {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, scale {opts.scale:g}, best of {opts.repeat}, over "
        f"{'HTTP' if opts.http else 'HTTPS'}, work folder {workdir}"
    )
    if os.getloadavg()[0] > 0.5:
        print(f"warning: load average {os.getloadavg()[0]:.2f}; other processes share the CPUs")
    failures: list[str] = []
    try:
        start = time.perf_counter()
        sets, rows = write_tables(workdir / "src", opts.scale)
        print(f"tables written in {time.perf_counter() - start:.1f} s")
        azurite.start()
        container = azurite.create_container(STORE)
        for name in opts.tables:
            seed(container, sets[name])
        ws = write_workspace(workdir / "workspace.yaml", azurite)
        for name in opts.tables:
            failures += bench_table(sets[name], rows, azurite, ws, opts)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        azurite.stop()
        if opts.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nMB/s: file bytes (10^6) per second; load average {os.getloadavg()[0]:.2f} at the end")
    if failures:
        print(f"{len(failures)} failure(s):\n  " + "\n  ".join(failures))
        return 1
    print("every contender ran and returned every row")
    return 0


if __name__ == "__main__":
    sys.exit(main())
