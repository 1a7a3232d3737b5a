"""`make posix`: the POSIX suite pjdfstest run from inside an rw_mount and a ro_mount
of datamount over a real Azurite, per directory of the suite, beside the previous
run's figures. Not part of `make test` (it takes minutes; nothing is asserted).

The suite's source is the pjdfstest tree PJDFSTEST_SRC names (required); it is copied to
.posix/pjdfstest and built there with autotools (`autoreconf -ifs`, `./configure`,
`make pjdfstest`: the Makefile installs autoconf/automake when missing). Each
directory of its tests/ is run by `prove -v -r DIR` with the mount as the working
directory (pjdfstest creates its files in the current directory), under a time
limit per directory; the cases are the TAP lines (`ok N` / `not ok N`) it prints.
Results go to .posix/last.json (the next run prints them beside its own) and
.posix/<mode>-<dir>.tap (the full output). Everything this starts (Azurite, the
mounts) is stopped in a finally, Ctrl-C included.

Usage: scripts/posix.py [--only DIR,DIR] [--modes rw_mount,ro_mount] [--timeout S]
Exit 0 when every directory ran to its end (whatever passed), 1 when one hung
past the time limit or a mount failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the test harness's Azurite launcher

from azurite import Azurite  # noqa: E402

WORK = REPO / ".posix"
SUITE_SRC = Path(os.environ["PJDFSTEST_SRC"]) if os.environ.get("PJDFSTEST_SRC") else None
DATAMOUNT = str(Path(sys.executable).parent / "datamount")
MODES = ("rw_mount", "ro_mount")
CASE = re.compile(rb"^(not ok|ok) \d+", re.MULTILINE)


def build() -> Path:
    """The suite built under .posix/pjdfstest (rebuilt when its source changed)."""
    suite = WORK / "pjdfstest"
    binary = suite / "pjdfstest"
    if SUITE_SRC is None or not (SUITE_SRC / "pjdfstest.c").exists():
        found = f" ({SUITE_SRC} holds no pjdfstest.c)" if SUITE_SRC else ""
        raise SystemExit(f"posix: set PJDFSTEST_SRC to a pjdfstest source tree{found}")
    source = SUITE_SRC / "pjdfstest.c"
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return suite
    shutil.rmtree(suite, ignore_errors=True)
    shutil.copytree(SUITE_SRC, suite)
    for argv in (["autoreconf", "-ifs"], ["./configure", "-q"], ["make", "-s", "pjdfstest"]):
        done = subprocess.run(argv, cwd=suite, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"posix: {' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    print(f"built {binary}")
    return suite


def write_setup(folder: Path, azurite: Azurite, container: str) -> tuple[Path, dict[str, str]]:
    """A workspace with datastore `store` on `container`, and the CLI's environment."""
    ws = folder / "workspace.yaml"
    ws.write_text(
        "datastores:\n"
        f"  store: {{account_name: {azurite.account}, container_name: {container}, "
        f"endpoint: '{azurite.endpoint}', credentials: {{account_key: '${{POSIX_KEY}}'}}}}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATASET_", "RSLEX_"))}
    env.update(
        POSIX_KEY=azurite.key,
        DATAMOUNT_WORKSPACE=str(ws),
        DATAMOUNT_CACHE_DIR=str(folder / "cache"),
        DATAMOUNT_LOG_DIR=str(folder / "logs"),
    )
    return ws, env


def mount(mode: str, folder: Path, env: dict[str, str]) -> Path:
    spec = folder / f"{mode}.yaml"
    direction = "outputs" if mode == "rw_mount" else "inputs"
    path = "azureml://datastores/store/paths/posix/"
    spec.write_text(f"{direction}:\n  fs: {{type: uri_folder, path: '{path}', mode: {mode}}}\n")
    mp = folder / f"mnt-{mode}"
    done = subprocess.run(
        [DATAMOUNT, "mount", str(spec), str(mp)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"datamount mount ({mode}): {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def unmount(mp: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [DATAMOUNT, "unmount", str(mp), "--timeout", "60"], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        print(f"warning: unmount {mp}: {done.stderr.strip()[-300:]}", file=sys.stderr)
        subprocess.run(["fusermount3", "-uz", str(mp)], capture_output=True)


def run_dir(suite: Path, name: str, cwd: Path, timeout: float, tap: Path) -> dict[str, object]:
    """prove -v -r over one directory of the suite, from inside the mount."""
    started = time.monotonic()
    argv = ["prove", "-v", "-r", str(suite / "tests" / name)]
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, timeout=timeout)
        out, hung = done.stdout + done.stderr, False
    except subprocess.TimeoutExpired as exc:
        out, hung = (exc.stdout or b"") + (exc.stderr or b""), True
    tap.write_bytes(out)
    cases = [m.group(1) for m in CASE.finditer(out)]
    passed = sum(c == b"ok" for c in cases)
    return {
        "passed": passed,
        "failed": len(cases) - passed,
        "seconds": round(time.monotonic() - started, 1),
        "hung": hung,
    }


def table(results: dict, previous: dict) -> None:
    print(f"\n{'directory':<16}" + "".join(f"{m:>24}" for m in results))
    dirs = sorted({d for by_dir in results.values() for d in by_dir})
    totals = {m: [0, 0, 0, 0] for m in results}

    def cell(now: dict | None, before: dict | None, sums: list[int]) -> str:
        if now is None:
            return f"{'-':>24}"
        total = now["passed"] + now["failed"]
        sums[0] += now["passed"]
        sums[1] += total
        text = f"{now['passed']}/{total}" + (" HUNG" if now["hung"] else "")
        if before is not None:
            sums[2] += before["passed"]
            sums[3] += before["passed"] + before["failed"]
            text += f" (was {before['passed']}/{before['passed'] + before['failed']})"
        return f"{text:>24}"

    for d in dirs:
        line = f"{d:<16}"
        for m, by_dir in results.items():
            line += cell(by_dir.get(d), previous.get(m, {}).get(d), totals[m])
        print(line)
    line = f"{'total':<16}"
    for m in results:
        p, t, bp, bt = totals[m]
        text = f"{p}/{t}" + (f" (was {bp}/{bt})" if bt else "")
        line += f"{text:>24}"
    print(line)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated directories of tests/")
    parser.add_argument("--modes", default=",".join(MODES), help="rw_mount,ro_mount")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per directory")
    opts = parser.parse_args(argv)
    opts.modes = [m for m in opts.modes.split(",") if m]
    if not opts.modes or set(opts.modes) - set(MODES):
        parser.error("--modes takes rw_mount and/or ro_mount")
    return opts


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("posix: pjdfstest must run as root (it changes owners and modes)")
    WORK.mkdir(exist_ok=True)
    suite = build()
    dirs = sorted(p.name for p in (suite / "tests").iterdir() if p.is_dir())
    if opts.only:
        wanted = set(opts.only.split(","))
        if wanted - set(dirs):
            raise SystemExit(f"posix: no such directories: {sorted(wanted - set(dirs))}")
        dirs = [d for d in dirs if d in wanted]
    last = WORK / "last.json"
    previous = json.loads(last.read_text()) if last.exists() else {}
    folder = Path(tempfile.mkdtemp(prefix="datamount-posix-"))
    azurite = Azurite(folder / "azurite")
    results: dict[str, dict[str, dict]] = {}
    bad = 0
    mounted: list[Path] = []
    env: dict[str, str] = {}
    try:
        azurite.start()
        client = azurite.create_container("posix")
        azurite.seed(client, {"posix/README": b"the ro_mount's source must exist\n"})
        container = client.container_name
        _, env = write_setup(folder, azurite, container)
        for mode in opts.modes:
            try:
                mp = mount(mode, folder, env)
            except RuntimeError as exc:
                print(f"FAIL {exc}", file=sys.stderr)
                bad += 1
                continue
            mounted.append(mp)
            results[mode] = {}
            for d in dirs:
                tap = WORK / f"{mode}-{d}.tap"
                r = results[mode][d] = run_dir(suite, d, mp, opts.timeout, tap)
                bad += bool(r["hung"])
                hung = "  HUNG" if r["hung"] else ""
                print(f"  {mode:<9} {d:<16} {r['passed']:>5} ok {r['failed']:>5} not ok "
                      f"{r['seconds']:>7.1f} s{hung}", flush=True)  # fmt: skip
            unmount(mp, env)
            mounted.remove(mp)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    finally:
        for mp in mounted:
            unmount(mp, env)
        azurite.stop()
        shutil.rmtree(folder, ignore_errors=True)
    table(results, previous)
    last.write_text(json.dumps({**previous, **results}, indent=1, sort_keys=True))
    print(f"full outputs: {WORK}/<mode>-<dir>.tap; figures kept in {last}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
