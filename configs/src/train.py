"""The demo job's training script: reads the mounted and the downloaded input,
writes a small "model" into the output folder."""

import argparse
import csv
import json
import os

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--table", required=True)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--out", required=True)
parser.add_argument("--checkpoints", help="written epoch by epoch (an rw_mount output)")
args = parser.parse_args()

images = sorted(
    os.path.relpath(os.path.join(root, name), args.data)
    for root, _dirs, names in os.walk(args.data)
    for name in names
)
total = sum(os.path.getsize(os.path.join(args.data, name)) for name in images)
with open(args.table, newline="") as f:
    rows = list(csv.DictReader(f))
survived = sum(row["Survived"] == "1" for row in rows)
for epoch in range(1, args.epochs + 1):
    print(f"epoch {epoch}: {len(images)} images ({total} bytes), {len(rows)} passengers")
    if args.checkpoints:
        with open(os.path.join(args.checkpoints, f"epoch-{epoch}.json"), "w") as f:
            json.dump({"epoch": epoch, "images_seen": epoch * len(images)}, f)
model = {"images": len(images), "passengers": len(rows), "survival_rate": survived / len(rows)}
with open(os.path.join(args.out, "model.json"), "w") as f:
    json.dump(model, f)
print(f"wrote {args.out}/model.json: {model}")
