"""`make image-test`: run the datamount image for real with podman (rootful).

1. Container: Azurite on the host's loopback (tests/azurite.py), the image
   run with `--device /dev/fuse --cap-add SYS_ADMIN --network host` and a bind
   mount with `rshared` propagation; `datamount mount --foreground` inside;
   `status --ready` inside answers; the host reads every file byte-exact
   through the bind mount; SIGTERM to the container while the host holds a
   file open: the daemon drains (still serving), then unmounts once it is
   closed, exit 0, nothing left mounted on the host. The mount is opened to
   other users as the pod manifests open it (DATAMOUNT_MOUNT_ALLOW_OTHER,
   _UID / _GID the trainer's, modes 0440 / 0550): on the host the trainer's
   uid reads a file, a third uid is refused (setpriv).
2. Pod: docker/k8s/pod-account-key.yaml under `podman kube play` (pod.yaml,
   the default, is the same pod with AKS workload identity, which needs the
   cluster's webhook), adapted where podman 4.3 differs from a cluster
   (printed): the trainer, running as uid/gid 1000 (its securityContext),
   reads the data; a third uid in the trainer's container is refused;
   `podman kube down` drains, nothing left mounted.

PODMAN and PODMAN_ULIMITS (from the Makefile) carry the podman settings that
work on this machine kind. Secrets: the account key reaches podman only
through the environment (`-e NAME` without a value) or a podman secret,
never argv. Single-threaded.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the test harness's Azurite launcher

from azurite import Azurite  # noqa: E402

PODMAN = shlex.split(os.environ.get("PODMAN", "podman"))
_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
ULIMITS = shlex.split(os.environ.get("PODMAN_ULIMITS", f"--ulimit nofile={_NOFILE}:{_NOFILE}"))
NAME = "datamount-image-test"
POD = "train"
KEY_ENV = "AZURE_STORAGE_KEY"
SECRET = "datamount-workspace"
STEP_TIMEOUT = 60.0
MANIFEST = "docker/k8s/pod-account-key.yaml"
TRAINER_UID = 1000  # the manifests' runAsUser / runAsGroup and DATAMOUNT_MOUNT_UID / _GID
OTHER_UID = 2000  # a third user: neither the mounting root nor the trainer
ACCESS = {"DATAMOUNT_MOUNT_ALLOW_OTHER": "true", "DATAMOUNT_MOUNT_UID": str(TRAINER_UID),
          "DATAMOUNT_MOUNT_GID": str(TRAINER_UID), "DATAMOUNT_MOUNT_FILE_MODE": "0440",
          "DATAMOUNT_MOUNT_DIR_MODE": "0550"}  # fmt: skip


def say(line: str) -> None:
    print(f"image-test: {line}", flush=True)


def podman(*args: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 120):
    out = subprocess.run([*PODMAN, *args], capture_output=True, text=True, env=env,
                         timeout=timeout)  # fmt: skip
    if check and out.returncode != 0:
        raise SystemExit(f"image-test: podman {args[0]} failed: {out.stderr.strip()}")
    return out


def fuse_mounts(under: Path) -> list[str]:
    with open("/proc/mounts") as f:
        fields = [line.split() for line in f]
    return [m[1] for m in fields if m[2].startswith("fuse") and m[1].startswith(str(under))]


def wait_for(what: str, predicate, timeout: float = STEP_TIMEOUT) -> float:  # noqa: ANN001
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"image-test: FAILED: {what} not within {timeout:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - start


@contextlib.contextmanager
def shared_dir(path: Path) -> Iterator[Path]:
    """`path` as a shared mount point of its own (`rshared` bind sources must be shared)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    subprocess.run(["mount", "--make-rshared", str(path)], check=True)
    try:
        yield path
    finally:
        for left in reversed(fuse_mounts(path)):  # only after a failure
            subprocess.run(["fusermount3", "-uz", left], check=False)
        subprocess.run(["umount", "-l", str(path)], check=False)


def seed(azurite: Azurite) -> dict[str, bytes]:
    blobs = {f"images/part-{i}.bin": os.urandom((i + 1) * 700_000) for i in range(4)}
    blobs["images/labels/train.csv"] = b"id,label\n" + b"".join(
        f"{i},{i % 10}\n".encode() for i in range(5000)
    )
    azurite.seed(azurite.create_container("datasets"), blobs)
    return blobs


def write_config(folder: Path, azurite: Azurite) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "workspace.yaml").write_text(
        "datastores:\n"
        f"  training: {{account_name: {azurite.account}, container_name: datasets, "
        f"endpoint: '{azurite.endpoint}', credentials: {{account_key: '${{{KEY_ENV}}}'}}}}\n"
    )
    (folder / "input.yaml").write_text(
        "type: uri_folder\npath: azureml://datastores/training/paths/images/\nmode: ro_mount\n"
    )


def check_bytes(root: Path, blobs: dict[str, bytes]) -> int:
    total = 0
    for name, data in blobs.items():
        got = (root / name.removeprefix("images/")).read_bytes()
        if got != data:
            raise SystemExit(f"image-test: FAILED: {name}: {len(got)} bytes differ from the blob")
        total += len(got)
    return total


def read_as(uid: int, path: Path) -> subprocess.CompletedProcess[bytes]:
    """`head -c 64 path` as `uid` (its own group, no supplementary groups)."""
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "head", "-c", "64"]
    return subprocess.run([*cmd, str(path)], capture_output=True, timeout=STEP_TIMEOUT)


def check_access(mp: Path, blobs: dict[str, bytes]) -> None:
    """The trainer's uid reads a file of the mount; a third uid is refused."""
    name = sorted(blobs)[0]
    path = mp / name.removeprefix("images/")
    st = path.stat()
    got = (st.st_uid, st.st_gid, st.st_mode & 0o777)
    if got != (TRAINER_UID, TRAINER_UID, 0o440):
        raise SystemExit(f"image-test: FAILED: {path}: owner, group, mode {got}, expected "
                         f"{TRAINER_UID}, {TRAINER_UID}, 0o440")  # fmt: skip
    trainer = read_as(TRAINER_UID, path)
    if trainer.returncode != 0 or trainer.stdout != blobs[name][:64]:
        raise SystemExit(f"image-test: FAILED: uid {TRAINER_UID} could not read {path}: "
                         f"{trainer.stderr.decode(errors='replace').strip()}")  # fmt: skip
    other = read_as(OTHER_UID, path)
    if other.returncode == 0 or b"Permission denied" not in other.stderr:
        raise SystemExit(f"image-test: FAILED: uid {OTHER_UID} was not refused {path} "
                         f"(exit {other.returncode})")  # fmt: skip
    say(f"uid {TRAINER_UID} reads {path.name} (owner {TRAINER_UID}:{TRAINER_UID}, 0440); "
        f"uid {OTHER_UID}: Permission denied")  # fmt: skip


def container_test(image: str, tmp: Path, azurite: Azurite, blobs: dict[str, bytes]) -> None:
    config, logs = tmp / "config", tmp / "logs"
    write_config(config, azurite)
    logs.mkdir()
    env = {**os.environ, KEY_ENV: azurite.key}
    access = [arg for name, value in ACCESS.items() for arg in ("-e", f"{name}={value}")]
    with shared_dir(tmp / "data") as data:
        podman("rm", "-f", "-i", NAME, check=False)
        run = ["run", "-d", "--name", NAME, *ULIMITS, "--device", "/dev/fuse",
               "--cap-add", "SYS_ADMIN", "--network", "host", "--memory", "768m",
               "-v", f"{config}:/etc/datamount:ro", "-v", f"{data}:/mnt/data:rshared",
               "-v", f"{logs}:/var/log/datamount", "-e", "DATAMOUNT_LOG_DIR=/var/log/datamount",
               "-e", "DATAMOUNT_WORKSPACE=/etc/datamount/workspace.yaml",
               "-e", "DATASET_UNMOUNT_TIMEOUT_SECONDS=30", "-e", KEY_ENV, *access, image,
               "mount", "--foreground", "/etc/datamount/input.yaml", "/mnt/data/input"]  # fmt: skip
        say("podman " + " ".join(run))
        podman(*run, env=env)
        try:
            ready = ["exec", NAME, "datamount", "status", "--ready", "/mnt/data/input"]
            took = wait_for("status --ready", lambda: podman(*ready, check=False).returncode == 0)
            say(f"status --ready passed inside the container after {took:.1f} s")
            mp = data / "input"
            if str(mp) not in fuse_mounts(data):
                raise SystemExit(f"image-test: FAILED: {mp} not in the host's mount table")
            start = time.monotonic()
            total = check_bytes(mp, blobs)
            say(f"host read {len(blobs)} files, {total} bytes through the rshared bind mount: "
                f"byte-exact ({time.monotonic() - start:.2f} s)")  # fmt: skip
            check_access(mp, blobs)
            big = max(blobs, key=lambda n: len(blobs[n]))
            with open(mp / big.removeprefix("images/"), "rb") as held:
                head = held.read(1 << 20)
                podman("kill", "--signal", "TERM", NAME)
                time.sleep(3.0)
                state = podman("inspect", "-f", "{{.State.Running}}", NAME).stdout.strip()
                if state != "true" or str(mp) not in fuse_mounts(data):
                    raise SystemExit("image-test: FAILED: SIGTERM did not wait for the open file")
                say("SIGTERM sent while the host holds a file open: 3 s later still serving "
                    "(draining)")  # fmt: skip
                if head + held.read() != blobs[big]:
                    raise SystemExit("image-test: FAILED: the held file's bytes differ")
            closed = time.monotonic()
            code = podman("wait", NAME, timeout=STEP_TIMEOUT).stdout.strip()
            say(f"file closed: the container exited {time.monotonic() - closed:.1f} s later "
                f"with code {code}")  # fmt: skip
            left = fuse_mounts(data)
            if code != "0" or left:
                raise SystemExit(f"image-test: FAILED: exit {code}, left mounted: {left}")
            say("no mount left on the host")
            runtime = "".join(p.read_text() for p in logs.glob("*.log"))
            for line in runtime.splitlines():
                if any(w in line for w in ("budget ", "unmount", "files still open")):
                    say(f"  log: {line.strip()[:200]}")
        finally:
            podman("rm", "-f", "-i", NAME, check=False)


def kube_manifest(image: str, data: Path, cache: Path) -> tuple[list[dict], list[str]]:
    """MANIFEST adapted to podman 4.3 and this machine; the changes, said."""
    docs = [d for d in yaml.safe_load_all((REPO / MANIFEST).read_text()) if d]
    pod = next(d for d in docs if d["kind"] == "Pod")
    spec = pod["spec"]
    changes = [
        "hostNetwork: true (Azurite listens on the host's loopback)",
        "the native sidecar (initContainer, restartPolicy: Always) moved to containers: "
        "podman 4.3 runs init containers to completion before the others",
        "the trainer waits for its data itself (no startupProbe gating in podman)",
        "volumes data and cache: hostPath on a shared host folder instead of emptyDir",
        "stopped with `podman pod stop -t GRACE` before `kube down`: podman 4.3's kube down "
        "SIGKILLs every container (podman#22397, fixed in 5.1); podman runs no preStop hook",
        "the startup/readiness probe's command run with `podman exec` (podman 4.3 turns only "
        "a livenessProbe into a healthcheck)",
    ]
    spec["hostNetwork"] = True
    sidecars = [c for c in spec.pop("initContainers") if c.get("restartPolicy") == "Always"]
    for c in sidecars:
        c.pop("restartPolicy")
        c["image"] = image
    trainer = spec["containers"][0]
    trainer["image"] = image
    trainer["command"] = ["python3", "-c", f"exec({TRAINER!r})"]  # one line: podman's YAML
    spec["containers"] = [*sidecars, *spec["containers"]]
    for v in spec["volumes"]:
        if v["name"] == "data":
            v.pop("emptyDir")
            v["hostPath"] = {"path": str(data), "type": "Directory"}
        if v["name"] == "cache":
            v.pop("emptyDir")
            v["hostPath"] = {"path": str(cache), "type": "DirectoryOrCreate"}
    return docs, changes


def spec_grace(docs: list[dict]) -> int:
    pod = next(d for d in docs if d["kind"] == "Pod")
    return int(pod["spec"].get("terminationGracePeriodSeconds", 30))


# The test's trainer: waits for the mount, prints one digest line per file.
TRAINER = """
import hashlib, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
root = '/mnt/data/input'
print('uid', os.getuid(), os.getgid(), flush=True)
for _ in range(600):
    if os.path.isdir(root) and os.listdir(root):
        break
    time.sleep(0.2)
for d, _, files in sorted(os.walk(root)):
    for f in sorted(files):
        p = os.path.join(d, f)
        digest = hashlib.sha256(open(p, 'rb').read()).hexdigest()
        print('digest', os.path.relpath(p, root), digest, flush=True)
print('trainer done', flush=True)
time.sleep(100000)
"""


def check_kube_access(trainer: str, logs: str, blobs: dict[str, bytes]) -> None:
    """The trainer ran as TRAINER_UID; a third uid in its container is refused."""
    want = f"uid {TRAINER_UID} {TRAINER_UID}"
    if want not in logs.splitlines():
        raise SystemExit(f"image-test: FAILED: the trainer did not run as {want[4:]}")
    path = "/mnt/data/input/" + sorted(blobs)[0].removeprefix("images/")
    read = ["exec", "--user", f"{OTHER_UID}:{OTHER_UID}", trainer, "head", "-c", "64", path]
    other = podman(*read, check=False)
    if other.returncode == 0 or "Permission denied" not in other.stderr:
        raise SystemExit(f"image-test: FAILED: uid {OTHER_UID} in the trainer's container was "
                         f"not refused {path} (exit {other.returncode})")  # fmt: skip
    say(f"kube: the trainer runs as {TRAINER_UID}:{TRAINER_UID} and reads; uid {OTHER_UID} "
        f"in its container: Permission denied")  # fmt: skip


def kube_test(image: str, tmp: Path, azurite: Azurite, blobs: dict[str, bytes]) -> None:
    config = tmp / "kube-config"
    write_config(config, azurite)
    cache = tmp / "kube-cache"
    with shared_dir(tmp / "kube-data") as data:
        docs, changes = kube_manifest(image, data, cache)
        values = {"workspace.yaml": (config / "workspace.yaml").read_text(),
                  "account-key": azurite.key}  # fmt: skip
        secret = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
        # A secret volume, by contrast, is read as a Secret object whose `data`
        # values are taken verbatim (not base64-decoded), and its stringData is ignored.
        file_secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                       "metadata": {"name": f"{SECRET}-file"}, "data": values}  # fmt: skip
        changes.append(
            f"the Secret stored twice with `podman secret create`: podman 4.3 reads a "
            f"secretKeyRef as a JSON map of base64 values ({SECRET}) but a secret volume as a "
            f"Secret object with its data verbatim ({SECRET}-file, which the volume names); "
            f"`kube play` of a Secret stores it in neither form"
        )
        for v in next(d for d in docs if d["kind"] == "Pod")["spec"]["volumes"]:
            if "secret" in v:
                v["secret"]["secretName"] = f"{SECRET}-file"
        secret_file = tmp / "secret.yaml"
        secret_file.write_text(json.dumps(secret, indent=1))
        secret_file.chmod(0o600)
        file_secret_file = tmp / "secret-file.yaml"
        file_secret_file.write_text(json.dumps(file_secret, indent=1))
        file_secret_file.chmod(0o600)
        manifest = tmp / "pod.yaml"
        manifest.write_text(yaml.safe_dump_all(docs))
        podman("kube", "down", str(manifest), check=False)
        podman("volume", "rm", "-f", "datamount-spec", f"{SECRET}-file", check=False)
        for change in changes:
            say(f"kube: adapted: {change}")
        # kube play takes no --ulimit: the same limits as podman's defaults.
        conf = tmp / "containers.conf"
        limits = [u for u in ULIMITS if u != "--ulimit"]
        conf.write_text(
            "[containers]\ndefault_ulimits = [" + ", ".join(f'"{u}"' for u in limits) + "]\n"
        )
        os.environ["CONTAINERS_CONF"] = str(conf)
        for name in (SECRET, f"{SECRET}-file"):
            podman("secret", "rm", name, check=False)
        podman("secret", "create", SECRET, str(secret_file))
        podman("secret", "create", f"{SECRET}-file", str(file_secret_file))
        try:
            start = time.monotonic()
            podman("kube", "play", str(manifest), timeout=STEP_TIMEOUT)
            say(f"kube play: pod {POD} up in {time.monotonic() - start:.1f} s")
            sidecar, trainer = f"{POD}-datamount", f"{POD}-trainer"

            def logs() -> str:
                return podman("logs", trainer, check=False).stdout

            wait_for("the trainer's digests", lambda: "trainer done" in logs())
            want = {
                n.removeprefix("images/"): hashlib.sha256(b).hexdigest() for n, b in blobs.items()
            }
            got = {
                p[1]: p[2]
                for p in (ln.split() for ln in logs().splitlines())
                if p[:1] == ["digest"]
            }
            if got != want:
                raise SystemExit(f"image-test: FAILED: the trainer read {got}, expected {want}")
            say(f"kube: the trainer read {len(got)} files through HostToContainer: sha256 match")
            check_kube_access(trainer, logs(), blobs)
            health = podman("inspect", "-f", "{{json .Config.Healthcheck}}", sidecar).stdout
            say(f"kube: podman's healthcheck of the sidecar (from the probes): {health.strip()}")
            ready = podman("exec", sidecar, "datamount", "status", "--ready", "/mnt/data/input")
            say(f"kube: in the sidecar: {ready.stdout.strip()}")
            # podman 4.3's kube down SIGKILLs every container (podman#22397,
            # fixed in 5.1): a pod stop first, SIGTERM then the grace period.
            start = time.monotonic()
            podman("pod", "stop", "-t", str(spec_grace(docs)), POD, timeout=STEP_TIMEOUT)
            code = podman("inspect", "-f", "{{.State.ExitCode}}", sidecar).stdout.strip()
            say(f"kube: pod stop (SIGTERM): the sidecar drained and exited {code} "
                f"in {time.monotonic() - start:.1f} s")  # fmt: skip
            if code != "0":
                raise SystemExit(f"image-test: FAILED: the sidecar exited {code}")
            start = time.monotonic()
            podman("kube", "down", str(manifest), timeout=STEP_TIMEOUT)
            say(f"kube down: {time.monotonic() - start:.1f} s")
            left = fuse_mounts(data)
            if left:
                raise SystemExit(f"image-test: FAILED: left mounted after kube down: {left}")
            say("kube: no mount left on the host")
            for log in (cache / "logs").glob("*.log"):
                for line in log.read_text().splitlines():
                    if "unmount" in line or "budget" in line and "readstack" in line:
                        say(f"  sidecar log: {line.strip()[:200]}")
        except SystemExit:
            for name in (f"{POD}-datamount", f"{POD}-trainer"):
                out = podman("logs", name, check=False)
                say(f"logs of {name}:\n{(out.stdout + out.stderr)[-3000:]}")
            for log in (cache / "logs").glob("*.log"):
                lines = [
                    ln for ln in log.read_text().splitlines() if "datamount.settings" not in ln
                ]
                say(f"{log.name}:\n" + "\n".join(lines[-25:]))
            raise
        finally:
            podman("kube", "down", str(manifest), check=False)
            for name in (SECRET, f"{SECRET}-file"):
                podman("secret", "rm", name, check=False)
            # kube down keeps the volumes made for the ConfigMap and the Secret,
            # and a kept volume is not refilled by the next kube play.
            podman("volume", "rm", "-f", "datamount-spec", f"{SECRET}-file", check=False)
            os.environ.pop("CONTAINERS_CONF", None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="localhost/datamount:latest")
    parser.add_argument("--skip-kube", action="store_true", help="the container part only")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("image-test: needs root (rootful podman, mount --make-rshared)")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="datamount-image-test-") as name:
        tmp = Path(name)
        with Azurite(tmp / "azurite") as azurite:
            blobs = seed(azurite)
            say(f"Azurite on {azurite.endpoint}, {len(blobs)} blobs seeded")
            container_test(args.image, tmp, azurite, blobs)
            if not args.skip_kube:
                kube_test(args.image, tmp, azurite, blobs)
    say(f"PASSED in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
