"""`datamount download` and `datamount upload`: a spec entry or a bare path
or URI copied in parallel (modes/download.py runs the transfer), with a
progress line on stderr and one summary line at the end. No threads of its
own (the progress line's refresh thread is the Progress's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from datamount.cli.parser import PROG
from datamount.modes.context import Context
from datamount.settings import Settings
from datamount.transfer.progress import Progress, human


def run(ctx: Context, args: argparse.Namespace) -> None:
    """`download SOURCE DEST` or `upload SRC DEST`."""
    from datamount.modes import download

    if args.command == "upload":
        with progress("upload", ctx.settings) as shown:
            sent = download.upload(
                ctx, Path(args.src), args.dest, name=args.output,
                overwrite=args.overwrite, progress=shown,
            )  # fmt: skip
        print(summary("uploaded", sent.files, sent.bytes, sent.seconds,
                      sent.skipped_files, "unchanged"), file=sys.stderr)  # fmt: skip
        return
    with progress("download", ctx.settings) as shown:
        result = download.download(
            ctx, args.source, Path(args.dest), name=args.input, overwrite=args.overwrite,
            progress=shown, shard=download.Shard.from_context(ctx) if args.shard else None,
        )  # fmt: skip
    print(result.path)
    print(summary("downloaded", result.files, result.bytes, result.seconds,
                  result.skipped_files, "already complete"), file=sys.stderr)  # fmt: skip


def progress(verb: str, settings: Settings) -> Progress:
    """The progress line; with DATAMOUNT_METRICS_PORT, its counters as metrics too."""
    port = settings.metrics_port
    metrics = None if port is None else (settings.metrics_host, port)
    return Progress(verb, sys.stderr, tty=sys.stderr.isatty(), metrics=metrics)


def summary(verb: str, files: int, nbytes: int, seconds: float, skipped: int, why: str) -> str:
    rate = nbytes / max(seconds, 1e-9) / 1e6
    return (
        f"{PROG}: {verb} {files} files, {human(nbytes)} in {seconds:.1f} s ({rate:.0f} MB/s); "
        f"{skipped} skipped ({why})"
    )
