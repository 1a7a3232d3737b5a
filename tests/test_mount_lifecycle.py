"""mountd without FUSE: the mount table, the state file, the start-up
handshake with a stand-in daemon, and mount point checks."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datamount.errors import DataError, DatamountError
from datamount.mount import control, table

pytestmark = pytest.mark.unit


def test_mountinfo_parsing_unescapes_paths(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
        "90 22 0:45 / /tmp/with\\040space/mnt rw,nosuid,nodev shared:1 - fuse.datamount "
        "datamount:train ro,user_id=0\n"
    )
    entries = table.mounts(info)
    assert entries[1] == table.MountEntry(
        "/tmp/with space/mnt", "fuse.datamount", "datamount:train", "0:45"
    )
    assert entries[0].fstype == "proc"


def test_state_file_round_trip(tmp_path: Path) -> None:
    state = control.MountState(pid=os.getpid(), mountpoint="/m", spec="/s.yaml", input="train",
                              uri="https://x/c/p/", started=1.0, stats_file="/l/s.json")  # fmt: skip
    path = control.state_file(tmp_path, Path("/m"))
    assert path == control.state_file(tmp_path, Path("/m/../m/"))  # one file per mount point
    control.write_json(path, state.__dict__)
    assert control.read_state(tmp_path, Path("/m")) == state
    path.write_text("{broken")
    assert control.read_state(tmp_path, Path("/m")) is None


def test_state_files_of_other_versions_read(tmp_path: Path) -> None:
    """Older state files (no mode) read as not rw_mount; unknown keys are skipped."""
    old = {"pid": 1, "mountpoint": "/m", "spec": "", "input": "input", "uri": "u",
           "started": 1.0, "stats_file": "/l/s.json"}  # fmt: skip
    control.write_json(control.state_file(tmp_path, Path("/m")), old)
    state = control.read_state(tmp_path, Path("/m"))
    assert state is not None and state.mode == "" and not state.writable
    newer = {**old, "mode": "rw_mount", "staging": "/c/staging/x", "future": 1}
    control.write_json(control.state_file(tmp_path, Path("/m")), newer)
    state = control.read_state(tmp_path, Path("/m"))
    assert state is not None and state.writable and state.staging == "/c/staging/x"


def test_alive_treats_zombies_as_gone() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while control.alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not control.alive(proc.pid)  # exited, not yet reaped: a zombie
    proc.wait()
    assert control.alive(os.getpid())


def test_mount_point_checks(tmp_path: Path) -> None:
    fresh = tmp_path / "a" / "b"
    control.prepare_mountpoint(fresh, tmp_path)
    assert fresh.is_dir()  # created
    (fresh / "x").write_text("x")
    with pytest.raises(DataError, match="is not empty"):
        control.prepare_mountpoint(fresh, tmp_path)
    with pytest.raises(DataError, match="is not a directory"):
        control.prepare_mountpoint(fresh / "x", tmp_path)


def fake_daemon(body: str) -> list[str]:
    """A stand-in daemon: `body` runs with `fd` = the readiness pipe."""
    script = "import sys, os, time\nfd = int(sys.argv[sys.argv.index('--ready-fd') + 1])\n" + body
    return [sys.executable, "-c", script]


def test_spawn_relays_the_daemons_error(tmp_path: Path) -> None:
    argv = fake_daemon(
        'os.write(fd, b\'{"error": "storage unreachable", "exit_code": 3}\\n\')\nsys.exit(3)\n'
    )
    with pytest.raises(DatamountError) as caught:
        control.spawn(argv, mountpoint=tmp_path / "m", log_file=tmp_path / "log")
    assert str(caught.value) == "storage unreachable" and caught.value.exit_code == 3


def test_spawn_reports_a_silent_exit(tmp_path: Path) -> None:
    argv = fake_daemon("print('oops', file=sys.stderr)\nsys.exit(7)\n")
    with pytest.raises(DataError, match="exited with status 7"):
        control.spawn(argv, mountpoint=tmp_path / "m", log_file=tmp_path / "log")
    assert "oops" in (tmp_path / "log").read_text()  # the daemon's stdio goes to the log


def test_spawn_gives_up_on_a_daemon_that_never_answers(tmp_path: Path) -> None:
    argv = fake_daemon("time.sleep(60)\n")
    started = time.monotonic()
    with pytest.raises(DataError, match="gave no answer"):
        control.spawn(argv, mountpoint=tmp_path / "m", log_file=tmp_path / "log", timeout=0.5)
    assert time.monotonic() - started < 15


def test_readiness_writes_one_line_once() -> None:
    r, w = os.pipe()
    ready = control.Readiness(w)
    ready.ok()
    ready.fail(DataError("too late"))  # ignored: the pipe is closed after the first answer
    assert os.read(r, 100) == b'{"ready": true}\n'
    os.close(r)
    control.Readiness(None).ok()  # no pipe (--foreground by hand): nothing to do


def test_unmount_of_something_not_mounted(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is not mounted"):
        control.unmount(tmp_path, cache_dir=tmp_path, timeout=1)


def test_the_daemon_refuses_a_channel_without_a_plan(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "datamount.mount.serve", str(tmp_path / "m")]
    for plan in ("not json", '{"mode": "ro_mount"}'):
        with pytest.raises(DatamountError, match="no mount plan on the start-up chan") as caught:
            control.spawn(argv, mountpoint=tmp_path / "m", log_file=tmp_path / "log", plan=plan)
        assert caught.value.exit_code == DataError("x").exit_code
    assert not (tmp_path / "m").exists()  # it mounted nothing, made nothing
    log = (tmp_path / "log").read_text()
    assert log.count("datamount: error: no mount plan on the start-up channel") == 2
    assert "Traceback" not in log
