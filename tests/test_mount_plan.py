"""Resolve once: `datamount mount` resolves an entry in the user-facing
process and hands the daemon a plan over its start-up channel. Real FUSE over
real Azurite, a FaultProxy in front of it to count requests; the plan's own
round trip without either.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from datamount.mount.plan import EvalFile, MountPlan
from datamount.settings import Settings
from datamount.storage.credentials import Credential
from datamount.storage.latency import PROBES
from datamount.storage.location import StorageKind, StorageLocation
from faultproxy import FaultProxy
from fuse_helpers import Mounts, datamount, mount_env, mounted, spec_file

DATA = bytes(range(256)) * 1000


def proxied_env(azurite, proxy: FaultProxy, tmp_path: Path, container) -> dict[str, str]:  # noqa: ANN001
    service = SimpleNamespace(account=azurite.account, key=azurite.key, endpoint=proxy.endpoint)
    return mount_env(service, tmp_path, container.container_name)


def workspace_loads(tmp_path: Path) -> int:
    log = (tmp_path / "cache" / "logs" / "datamount-runtime.log").read_text()
    return sum(" workspace " in line and " datastores, " in line for line in log.splitlines())


@pytest.mark.fuse
def test_one_mount_resolves_once_and_checks_the_source_once(
    azurite, container, proxy: FaultProxy, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"one/data.bin": DATA, "tree/a.txt": b"a", "tree/b/c.txt": b"c"})
    env = proxied_env(azurite, proxy, tmp_path, container)
    blob = f"/{azurite.account}/{container.container_name}/one/data.bin"

    file_spec = spec_file(
        tmp_path, "f", "uri_file", "azureml://datastores/store/paths/one/data.bin"
    )
    mp = mounts.point(tmp_path / "file")
    proxy.reset()
    out = datamount("mount", str(file_spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    # The source stat of the whole mount (before: one by `mount`, one by its
    # daemon), and the round-trip probe's (storage.latency) on its connection.
    heads = [r for r in proxy.requests if r.method == "HEAD" and r.path == blob]
    assert len(heads) == 1 + PROBES, proxy.requests
    assert workspace_loads(tmp_path) == 1  # the daemon loaded none
    assert (mp / "data.bin").read_bytes() == DATA

    folder_spec = spec_file(tmp_path, "d", "uri_folder", "azureml://datastores/store/paths/tree/")
    mp2 = mounts.point(tmp_path / "folder")
    proxy.reset()
    out = datamount("mount", str(folder_spec), str(mp2), env=env)
    assert out.returncode == 0, out.stderr
    listings = [r for r in proxy.requests if r.method == "GET" and r.range is None]
    assert len(listings) == 1, proxy.requests  # the source check's one listing page
    assert workspace_loads(tmp_path) == 2  # one per `datamount mount`
    assert sorted(p.name for p in mp2.iterdir()) == ["a.txt", "b"]
    for point in (mp, mp2):
        assert datamount("unmount", str(point), env=env).returncode == 0


@pytest.mark.fuse
def test_the_daemon_holds_no_secret_in_argv_or_environment(
    azurite, container, tmp_path: Path, mounts: Mounts
) -> None:  # noqa: ANN001
    azurite.seed(container, {"s/x.bin": DATA})
    env = mount_env(azurite, tmp_path, container.container_name)  # key from ${TEST_KEY}
    env.pop("OPENBLAS_NUM_THREADS", None)
    spec = spec_file(tmp_path, "input", "uri_folder", "azureml://datastores/store/paths/s/")
    mp = mounts.point(tmp_path / "mnt")
    out = datamount("mount", str(spec), str(mp), env=env)
    assert out.returncode == 0, out.stderr
    assert mounted(mp) and (mp / "x.bin").read_bytes() == DATA  # the key reached it
    pid = mounts.daemon(mp)
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    key = azurite.key.encode()
    assert not any(key in a for a in argv), argv
    assert not any(key in e for e in environ)
    assert not any(e.startswith(b"TEST_KEY=") for e in environ)
    # What it serves comes from the plan, not from re-reading spec or workspace.
    assert str(spec).encode() not in argv and b"--workspace" not in argv
    assert str(mp).encode() in argv  # named on its command line for `ps` (and fuse_helpers)
    assert env["DATAMOUNT_CACHE_DIR"].encode() in b"\0".join(environ)  # the rest is inherited
    # its own: one OpenBLAS thread, not one per core (docs/production.md)
    assert b"OPENBLAS_NUM_THREADS=1" in environ
    assert datamount("unmount", str(mp), env=env).returncode == 0


@pytest.mark.unit
def test_a_plan_survives_its_channel_and_prints_no_secret(tmp_path: Path) -> None:
    key = "c2VjcmV0LWtleS1mb3ItdGhlLXBsYW4="
    blob = StorageLocation(
        StorageKind.BLOB, "data/", "acct", "box", "https://acct.blob.example", "example",
        Credential.account_key(key),
    )  # fmt: skip
    sas = StorageLocation(
        StorageKind.BLOB, "t/f.csv", "other", "c", "https://other.blob.example",
        credential=Credential.sas("sv=2024&sig=abcdefghijklmnop"),
    )  # fmt: skip
    settings = Settings.from_env({"DATASET_MOUNT_CACHE_SIZE": "-1GB"}, cache_dir=tmp_path)
    plan = MountPlan(
        mode="eval_mount", name="table", direction="input", spec=str(tmp_path / "s.yaml"),
        mountpoint=tmp_path / "m", location=blob, is_file=False, settings=settings,
        staging=tmp_path / "st", eval_files=[EvalFile("other/c/t/f.csv", sas, 10, '"e"')],
        eval_text="paths:\n- file: ./other/c/t/f.csv\n",
    )  # fmt: skip
    line = plan.to_json()
    assert "\n" not in line and json.loads(line)["location"]["secret"] == key
    assert MountPlan.from_json(line) == plan
    assert plan.secrets() == sorted([key, "sv=2024&sig=abcdefghijklmnop"])
    assert key not in repr(plan) and "sig=abcdefghijklmnop" not in repr(plan)
    assert plan.path == tmp_path / "m"
    assert MountPlan.from_json(line.replace('"is_file": false', '"is_file": true')).path == (
        tmp_path / "m" / "data"
    )
