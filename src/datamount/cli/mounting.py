"""`datamount mount` and `datamount unmount`: one spec entry prepared at a
mount point as its mode says (modes.prepare: a FUSE mount, a download, an
upload folder, a URI), and its undoing (modes.finish: drain, unmount, upload).
No threads of its own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from datamount.cli.parser import PROG
from datamount.cli.transfers import progress
from datamount.modes.context import Context


def run(ctx: Context, args: argparse.Namespace) -> None:
    """`mount SPEC MOUNTPOINT` or `unmount MOUNTPOINT`."""
    from datamount import modes

    if args.command == "unmount":
        how = modes.finish(ctx, Path(args.mountpoint), timeout=args.timeout)
        print(f"{PROG}: {args.mountpoint}: {how}", file=sys.stderr)
        return
    printed: list[Path] = []

    def ready(path: Path) -> None:  # --foreground: the path as soon as the mount answers
        print(path, flush=True)
        printed.append(path)

    spec = ctx.load_spec(Path(args.spec))
    prepared = modes.How(
        progress=progress("download", ctx.settings),  # entered around a download only
        foreground=args.foreground,
        on_ready=ready,
    )
    path = modes.prepare(ctx, spec, spec.entry(args.input), Path(args.mountpoint), prepared)
    if not printed:
        print(path)
