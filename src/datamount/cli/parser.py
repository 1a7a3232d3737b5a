"""The command line's grammar: every command, its options and help, and the
global options that may come before or after the command's name. One job:
argparse in, a Namespace out; no command runs here (cli/main.py runs them).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from datamount import __version__
from datamount.settings import MAX_RETRIES

PROG = "datamount"


# The options every command takes, before or after the command's name
# (`datamount --cache-dir X validate SPEC`); after it wins.
GLOBAL_OPTIONS = ("workspace", "log_dir", "cache_dir")


def _add_global_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(
        "--workspace",
        dest=f"{prefix}workspace",
        metavar="FILE",
        help="workspace registry (default: $DATAMOUNT_WORKSPACE, else ./configs/workspace.yaml)",
    )
    parser.add_argument(
        "--log-dir",
        dest=f"{prefix}log_dir",
        metavar="DIR",
        help="log folder (default: $DATAMOUNT_LOG_DIR, else CACHE/logs)",
    )
    parser.add_argument(
        "--cache-dir",
        dest=f"{prefix}cache_dir",
        metavar="DIR",
        help="cache folder (default: $DATAMOUNT_CACHE_DIR)",
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, global options given before the command merged in."""
    args = build_parser().parse_args(argv)
    for name in GLOBAL_OPTIONS:
        before = getattr(args, f"global_{name}", None)
        if getattr(args, name, None) is None and before is not None:
            setattr(args, name, before)
    return args


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common)
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A per-node data runtime for ML training jobs (Azure ML inputs and outputs).",
    )
    _add_global_options(parser, prefix="global_")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    _validate(sub, common)
    _resolve(sub, common)
    _download(sub, common)
    _upload(sub, common)
    _mount(sub, common)
    _unmount(sub, common)
    _status(sub, common)
    _register(sub, common)
    _run(sub, common)
    return parser


def _validate(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "validate",
        parents=[common],
        help="check a spec against the Azure ML type x mode table (no network)",
        description="Check a spec; exit 0 when valid, 2 with one line per problem otherwise.",
    )
    p.add_argument(
        "spec", metavar="SPEC", help="spec YAML (one input, inputs/outputs, or a command job)"
    )


def _resolve(sub: Any, common: argparse.ArgumentParser) -> None:
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


def _download(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "download",
        parents=[common],
        help="copy an input to local disk in parallel (download mode)",
        description=(
            "Download a file (to DEST/<name>) or a folder tree (under DEST). Resumable: "
            "files already complete in DEST with the same size and etag are skipped."
        ),
    )
    p.add_argument("source", metavar="SOURCE", help="spec YAML (with --input) or a path/URI")
    p.add_argument("dest", metavar="DEST", help="destination folder")
    p.add_argument("--input", metavar="NAME", help="which input (when the spec has several)")
    p.add_argument("--overwrite", action="store_true", help="ignore earlier progress; copy all")
    p.add_argument(
        "--shard",
        choices=["auto"],
        help="auto: only this node's files of a folder, split by RANK / WORLD_SIZE "
        "(sha256 of each relative path; the same files on every rerun)",
    )


def _upload(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "upload",
        parents=[common],
        help="copy a local file or folder to storage in parallel (upload mode)",
        description=(
            "Upload SRC (a file, or every file under a folder) to DEST. Blobs that already "
            "hold the same size and MD5 are skipped."
        ),
    )
    p.add_argument("src", metavar="SRC", help="local file or folder")
    p.add_argument("dest", metavar="DEST", help="spec YAML (with --output) or a URI")
    p.add_argument("--output", metavar="NAME", help="which output (when the spec has several)")
    p.add_argument("--overwrite", action="store_true", help="upload even unchanged files")


def _mount(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "mount",
        parents=[common],
        help="make an input or output available at MOUNTPOINT (the sidecar entry point)",
        description=(
            "Prepare one spec entry at MOUNTPOINT as its mode says and return when it is "
            "ready; prints the path the job should use. ro_mount / rw_mount: a FUSE mount "
            "served by a background daemon (stays attached with --foreground); a uri_file "
            "shows as MOUNTPOINT/<file name>. download / eval_download: MOUNTPOINT is the "
            "destination. upload: an empty local folder, uploaded by `unmount`. direct: "
            "prints the URI."
        ),
    )
    p.add_argument("spec", metavar="SPEC", help="spec YAML")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="where the data appears")
    p.add_argument(
        "--input", metavar="NAME", help="which input or output (when the spec has several)"
    )
    p.add_argument(
        "--foreground",
        action="store_true",
        help="FUSE mounts: serve the mount in this process until it is unmounted or signalled",
    )


def _unmount(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "unmount",
        parents=[common],
        help="drain and unmount a mount (an upload output: upload it)",
        description=(
            "Wait until no file is open under MOUNTPOINT (at most --timeout seconds), "
            "unmount it and stop its daemon; still busy at the deadline, the unmount is forced."
        ),
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="the mount point")
    p.add_argument(
        "--timeout",
        metavar="S",
        type=float,
        help="seconds to wait for open files (default: $DATASET_UNMOUNT_TIMEOUT_SECONDS, 30)",
    )


def _status(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "status",
        parents=[common],
        help="list the mounts and upload outputs datamount serves on this node",
        description=(
            "One line per mount point recorded in the cache folder: FUSE mounts (state, "
            "daemon pid, source URI, bytes fetched, cache hits) and upload outputs waiting "
            "for their unmount. Read-only."
        ),
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument(
        "--ready",
        metavar="MOUNTPOINT",
        help="exit 0 when the datamount mount at MOUNTPOINT answers, 1 otherwise "
        "(a container's startup or readiness probe)",
    )
    p.add_argument(
        "--watch",
        metavar="SECONDS",
        nargs="?",
        const=2.0,
        type=_interval,
        help="refresh every SECONDS (default 2): a table on a terminal, else one line per "
        "mount per refresh; Ctrl-C ends it",
    )


def _register(sub: Any, common: argparse.ArgumentParser) -> None:
    for noun, what in (("data", "a data asset"), ("component", "a command component")):
        p = sub.add_parser(noun, help=f"register {what} YAML in the local registry")
        verbs = p.add_subparsers(dest="verb", metavar="VERB")
        verbs.required = True
        v = verbs.add_parser(
            "create", parents=[common], help=f"register {what} (as az ml {noun} create)"
        )
        v.add_argument("file", metavar="FILE", help=f"{what} YAML")
        v.add_argument(
            "--version", metavar="V", help="the version (default: the file's, else the next)"
        )


def _run(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run an Azure ML command job on this node (inputs, command, outputs)",
        description=(
            "Validate the job, materialise every input and output by its mode under a "
            "working folder, substitute ${{inputs.x}} / ${{outputs.y}} in its command, run "
            "it with bash in `code` with its environment_variables, then upload outputs, "
            "register assets, unmount and clean up. Exit code: the command's own; 3 when "
            "the data could not be prepared (the command never ran); 4 when outputs could "
            "not be written; 2 for an invalid job."
        ),
    )
    p.add_argument("job", metavar="JOB", help="Azure ML command or pipeline job YAML")
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="job working folder (default: a new temporary folder, removed at the end)",
    )
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary working folder and its logs"
    )
    p.add_argument(
        "--max-restarts",
        metavar="N",
        type=_restarts,
        help=(
            "run the command again up to N times after a transient end (killed by SIGKILL, "
            "or an exit code of DATAMOUNT_RUN_RESTART_EXIT_CODES), inputs still mounted and "
            "outputs in place; each pipeline step alike (default: DATAMOUNT_RUN_MAX_RESTARTS, "
            "else 0)"
        ),
    )
    p.add_argument(
        "--max-retries",
        metavar="N",
        type=_restarts,
        help=(
            "once the restarts are spent on a transient end, run the whole job again up to N "
            "times: inputs prepared anew (caches kept), outputs in place; each pipeline step "
            "alike (default: DATAMOUNT_RUN_MAX_RETRIES, else 0)"
        ),
    )


def _restarts(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= MAX_RETRIES:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_RETRIES}: {text!r}")
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"not a number of seconds > 0: {text!r}")
    return value
