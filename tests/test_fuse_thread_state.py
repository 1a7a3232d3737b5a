"""libfuse's worker threads keep their Python thread state from one call to
the next (fs/_lowlevel.c `gil_enter`): a real FUSE mount of the native loop,
served by lowlevel.run in the main thread of its own process as the daemon
does, stats 150 names; a threading.local value a call leaves on its worker
thread is there at that thread's next call. Without the kept state each call
would make a new thread state (and delete it on return), and the value would
be found by none."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fuse_helpers import mounted

pytestmark = pytest.mark.fuse

SERVE = textwrap.dedent(
    """
    import json, os, subprocess, sys, threading
    from datamount.fs import lowlevel
    from datamount.fs.namespace import Namespace
    from datamount.fs.ops import ReadOnlyFS
    from datamount.read.reader import DirectReader
    from datamount.storage.memory import MemoryStore

    mp = sys.argv[1]
    local = threading.local()
    seen = {}  # worker thread -> [callbacks, callbacks that found the thread's mark]

    class Probe(lowlevel.Ops):
        def lookup(self, path):
            count = seen.setdefault(threading.get_ident(), [0, 0])
            count[0] += 1
            count[1] += getattr(local, "mark", False)
            local.mark = True
            return super().lookup(path)

    lowlevel.Ops = Probe
    store = MemoryStore({f"ds/f{i}": b"x" * i for i in range(50)})
    fs = ReadOnlyFS(Namespace(store, "ds", ttl=0.0), DirectReader(store), store_id="mem")
    ready = threading.Event()

    def stat_all():
        ready.wait(30)
        try:
            for _ in range(3):
                for i in range(50):
                    os.stat(os.path.join(mp, f"f{i}"))  # entry timeout 0: a lookup each
        finally:
            subprocess.run(["fusermount3", "-u", mp], check=False)

    threading.Thread(target=stat_all, daemon=True).start()
    lowlevel.run(fs, mp, ttl_seconds=0.0, fsname="probe",
                     max_threads=2, on_ready=ready.set)
    print(json.dumps(list(seen.values())))
    """
)


def test_a_libfuse_worker_thread_keeps_its_python_thread_state(tmp_path: Path) -> None:
    mp = tmp_path / "mnt"
    mp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, str(mp)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if mounted(mp):
            subprocess.run(["fusermount3", "-uz", str(mp)], check=False)
    assert proc.returncode == 0, err.decode()
    counts = json.loads(out.decode().strip().splitlines()[-1])
    calls = sum(c for c, _ in counts)
    assert calls >= 150  # every stat reached the daemon
    assert sum(found for _, found in counts) == calls - len(counts)  # all but each first
