"""`make demo`: start an embedded Azurite on 127.0.0.1:10000 (the endpoint of
configs/workspace.yaml), seed a small dataset, run the CLI on the sample specs
(validate, resolve, mount/unmount, download, a whole command job with `run`)
and read through the storage layer, then stop Azurite — also on failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the test harness's Azurite launcher

from azure.storage.blob import BlobServiceClient  # noqa: E402

from azurite import KEY, SECOND, SECOND_KEY, Azurite  # noqa: E402
from datamount.jobspec.job import load_spec  # noqa: E402
from datamount.mltable import load  # noqa: E402
from datamount.storage import open_store  # noqa: E402
from datamount.workspace.datastores import Workspace  # noqa: E402

PORT = 10000
DATAMOUNT = str(Path(sys.executable).parent / "datamount")
TITANIC = b"PassengerId,Survived,Pclass,Name\n1,0,3,Braund\n2,1,1,Cumings\n3,1,3,Heikkinen\n"


def seed(azurite: Azurite) -> None:
    data = azurite.create_container("data")
    azurite.seed(data, {"titanic.csv": TITANIC, "titanic-v2.csv": TITANIC + b"4,1,1,Futrelle\n"})
    azurite.seed(
        data,
        {
            f"cifar/batch_{i}/img_{j}.bin": bytes([i * 10 + j]) * 4096
            for i in range(3)
            for j in range(4)
        },
    )
    lake = azurite.create_container("lake")
    azurite.seed(lake, {"events/2024/01/part-0.json": b'{"event": "start"}\n'})
    header = b"PassengerId,Survived,Pclass,Name\n"
    azurite.seed(
        lake,
        {
            "passengers/2023/q1.csv": header + b"5,0,3,Allen\n6,1,2,Moran\n",
            "passengers/2024/q1.csv": header + b"7,0,1,McCarthy\n",
            "passengers/notes.txt": b"not a table\n",
        },
    )
    # The second storage account (AZURITE_ACCOUNTS): a container of its own.
    second = BlobServiceClient(
        f"http://127.0.0.1:{PORT}/{SECOND}",
        credential={"account_name": SECOND, "account_key": SECOND_KEY},
    )
    with second:
        archive = second.create_container("archive")
        archive.upload_blob("passengers/1913.csv", header + b"8,1,1,Astor\n9,0,3,Sage\n")


def step(title: str, *args: str, env: dict[str, str]) -> None:
    print(f"\n$ datamount {' '.join(args)}    # {title}", flush=True)
    result = subprocess.run([DATAMOUNT, *args], env=env, cwd=REPO, stderr=subprocess.STDOUT)
    print(f"(exit {result.returncode})", flush=True)


def main() -> int:
    workdir = REPO / ".demo"
    env = {
        **os.environ,
        "AZURITE_ACCOUNT_KEY": KEY,
        "AZURITE_SECOND_KEY": SECOND_KEY,
        "DATAMOUNT_CACHE_DIR": str(workdir / "cache"),
    }
    azurite = Azurite(workdir)
    # Two storage accounts on one Azurite: the MLTable sample spans both.
    os.environ["AZURITE_ACCOUNTS"] = f"devstoreaccount1:{KEY};{SECOND}:{SECOND_KEY}"
    try:
        azurite.start(port=PORT)
    except Exception as exc:
        print(f"demo: cannot start Azurite on 127.0.0.1:{PORT}: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"Azurite is up at {azurite.endpoint}; seeding containers 'data' and 'lake'")
        seed(azurite)
        for spec in ("input-single.yaml", "inputs-outputs.yaml", "command-job.yaml"):
            step("a valid spec", "validate", f"configs/{spec}", env=env)
        step(
            "every problem, one line each, exit 2",
            "validate",
            "configs/invalid-modes.yaml",
            env=env,
        )
        for name in ("train", "titanic", "lake", "model"):
            step("direct mode", "resolve", "configs/inputs-outputs.yaml", "--input", name, env=env)
        step("a data asset by label", "resolve", "azureml:titanic@latest", env=env)

        mnt = workdir / "mnt" / "titanic"
        step("ro_mount: a FUSE mount, returns once it answers", "mount",
             "configs/inputs-outputs.yaml", str(mnt), "--input", "titanic", env=env)  # fmt: skip
        for name in sorted(os.listdir(mnt)):
            print(f"  head -2 {mnt / name}: {(mnt / name).read_text().splitlines()[:2]}")
        step("unmount drains and stops the daemon", "unmount", str(mnt), env=env)
        step("download mode: a parallel copy to local disk", "download",
             "configs/inputs-outputs.yaml", str(workdir / "dl"), "--input", "train",
             "--overwrite", env=env)  # fmt: skip
        (workdir / "workspace.assets.yaml").unlink(missing_ok=True)
        step("a whole command job: inputs mounted/downloaded, command run, output uploaded "
             "and registered", "run", "configs/command-job.yaml", env=env)  # fmt: skip
        step("the registered output", "resolve", "azureml:demo-model@latest", env=env)

        evaluated = workdir / "mnt" / "passengers"
        step("eval_mount: an MLTable over two accounts, only the files it selects",
             "mount", "configs/mltable-eval.yaml", str(evaluated), "--input", "passengers",
             env=env)  # fmt: skip
        for path in sorted(evaluated.rglob("*")):
            if path.is_file():
                print(f"  {path.relative_to(evaluated)}")
        print("\npandas, straight from storage (datamount.mltable.load):")
        workspace = Workspace.load(REPO / "configs" / "workspace.yaml", env)
        table = load(str(REPO / "configs" / "tables" / "passengers"), workspace)
        print(table.to_pandas_dataframe().to_string(index=False))
        same = load(str(evaluated)).to_pandas_dataframe()
        print(f"  (the eval_mount at {evaluated} loads to the same {len(same)} rows)")
        step("unmount", "unmount", str(evaluated), env=env)
        copied = workdir / "eval-copy"
        shutil.rmtree(copied, ignore_errors=True)
        step("eval_download: the same files copied", "mount", "configs/mltable-eval.yaml",
             str(copied), "--input", "passengers_copy", env=env)  # fmt: skip

        print("\nReading through the storage layer:")
        spec = load_spec(REPO / "configs" / "inputs-outputs.yaml")
        entry = spec.entry("train")
        location = workspace.resolve(
            entry.location, base_dir=spec.source.parent if spec.source else None
        )
        store = open_store(location)
        files = [obj for page in store.list_pages(location.key) for obj in page.objects]
        print(f"  {location.uri()}: {len(files)} blobs, {sum(f.size for f in files)} bytes")
        titanic = workspace.resolve(spec.entry("titanic").location)
        head = open_store(titanic).read(titanic.key, 0, 33)
        print(f"  {titanic.uri()} first bytes: {head!r}")
        # Each run writes under its own name, demo-train_<date>_<time>_<hex>/
        # (run_name in jobs/commandjob.py).
        outputs = [o.key for page in store.list_pages("demo-train_") for o in page.objects]
        print(f"  the job's outputs in storage: {outputs}")
        print(f"\nLogs: {workdir / 'cache' / 'logs'}")
        return 0
    finally:
        for point in (workdir / "mnt").glob("*"):  # whatever a failed step left mounted
            if os.path.ismount(point):
                subprocess.run([DATAMOUNT, "unmount", str(point)], env=env, check=False)
        azurite.stop()
        print("Azurite stopped.")


if __name__ == "__main__":
    sys.exit(main())
