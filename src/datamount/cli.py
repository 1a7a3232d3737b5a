"""Command line: parse arguments, read Settings once, call the app.

The only module that reads os.environ and the only one that prints to the
user. Every DatamountError becomes its message on stderr and its exit code;
anything unexpected becomes one line plus a traceback in the runtime log.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from datamount import __version__, app
from datamount.errors import EXIT_FAILURE, EXIT_OK, DatamountError
from datamount.log import setup_logging, shutdown_logging
from datamount.settings import Settings

log = logging.getLogger("datamount.cli")
PROG = "datamount"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--workspace",
        metavar="FILE",
        help="workspace registry (default: $DATAMOUNT_WORKSPACE, else ./configs/workspace.yaml)",
    )
    common.add_argument(
        "--log-dir", metavar="DIR", help="log folder (default: $DATAMOUNT_LOG_DIR, else CACHE/logs)"
    )
    common.add_argument(
        "--cache-dir", metavar="DIR", help="cache folder (default: $DATAMOUNT_CACHE_DIR)"
    )
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A per-node data runtime for ML training jobs (Azure ML inputs and outputs).",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "validate",
        parents=[common],
        help="check a spec against the Azure ML type x mode table (no network)",
        description="Check a spec; exit 0 when valid, 2 with one line per problem otherwise.",
    )
    p.add_argument(
        "spec", metavar="SPEC", help="spec YAML (one input, inputs/outputs, or a command job)"
    )

    p = sub.add_parser(
        "resolve",
        parents=[common],
        help="print the resolved URI of an input (direct mode)",
        description=(
            "Print the storage URI an input resolves to: https://, abfss:// or a local path."
        ),
    )
    p.add_argument("spec", metavar="SPEC", help="spec YAML, or a path/URI to resolve directly")
    p.add_argument(
        "--input", metavar="NAME", help="which input or output (when the spec has several)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_env(os.environ, cache_dir=args.cache_dir, log_dir=args.log_dir)
    except DatamountError as exc:
        return _fail(exc)
    _start_logging(settings, args.command)
    ctx = app.Context(settings, dict(os.environ), Path.cwd(), args.workspace)
    try:
        return _run(ctx, args)
    except DatamountError as exc:
        log.info("%s failed: %s", args.command, exc)
        return _fail(exc)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the last line of defence: one line, traceback in the log
        log.exception("unexpected error in %s", args.command)
        print(
            f"{PROG}: error: unexpected {type(exc).__name__}: {exc} "
            f"(details in {settings.log_dir})",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    finally:
        shutdown_logging()


def _run(ctx: app.Context, args: argparse.Namespace) -> int:
    if args.command == "validate":
        result = app.validate(ctx, Path(args.spec))
        spec = result.spec
        checked = (
            f"datastores and assets checked against {result.workspace_checked}"
            if result.workspace_checked
            else f"workspace not checked: {ctx.workspace_path()} not found"
        )
        print(
            f"{args.spec}: valid ({spec.shape} spec, {len(spec.data_inputs)} data inputs, "
            f"{len(spec.outputs)} outputs; {checked})"
        )
        return EXIT_OK
    if args.command == "resolve":
        for _name, uri in app.resolve(ctx, args.spec, args.input):
            print(uri)
        return EXIT_OK
    raise AssertionError(f"unhandled command {args.command}")


def _start_logging(settings: Settings, command: str) -> None:
    try:
        files = setup_logging(
            settings.log_dir, level=settings.log_level, settings_lines=settings.describe()
        )
    except OSError as exc:
        print(
            f"{PROG}: warning: cannot write logs to {settings.log_dir}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return
    log.info("datamount %s: %s (logs in %s)", __version__, command, files.runtime.parent)


def _fail(exc: DatamountError) -> int:
    for line in str(exc).splitlines() or [type(exc).__name__]:
        print(f"{PROG}: error: {line}", file=sys.stderr)
    return exc.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
