"""The `workspace` argument of the library entry points that code outside
datamount calls (`datamount.mltable.load`, the `azureml` fsspec filesystem).

A Workspace is used as given; a str or os.PathLike names a workspace file;
None (or "") finds one the way the CLI does (`find_workspace`):
`DATAMOUNT_WORKSPACE`, else `./configs/workspace.yaml`. The entry points are their own composition
roots, so they pass `os.environ` and the working directory in; this module
reads neither. No threads.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from datamount.workspace.datastores import Workspace, find_workspace

WorkspaceArg = Workspace | str | os.PathLike[str] | None


def workspace_from(
    value: object, environ: Mapping[str, str], cwd: Path, *, missing_ok: bool
) -> Workspace:
    """The Workspace `value` stands for; `${VAR}`s in a file expand from `environ`.

    With `missing_ok`, value None and no `DATAMOUNT_WORKSPACE` and no
    `./configs/workspace.yaml` give an empty workspace (local paths and
    account URIs still work); otherwise that is a WorkspaceError. A file named
    explicitly (argument or variable) must exist either way.
    """
    if isinstance(value, Workspace):
        return value
    if _ambient(value):
        path = find_workspace(None, environ, cwd)
        if missing_ok and not environ.get("DATAMOUNT_WORKSPACE") and not path.exists():
            return Workspace.empty()
        return Workspace.load(path, environ)
    name = os.fspath(value) if isinstance(value, str | os.PathLike) else None
    if isinstance(name, str):
        path = Path(name)
        return Workspace.load(path if path.is_absolute() else cwd / path, environ)
    raise TypeError(
        "workspace: expected a datamount Workspace, a path to a workspace file "
        f"(str or os.PathLike), or None; got {type(value).__name__}"
    )


def workspace_source(
    value: object, environ: Mapping[str, str], cwd: Path
) -> Callable[[], Workspace]:
    """`workspace_from(..., missing_ok=True)` for `load`, deferred for None.

    A Workspace or a file named by the caller is taken (read, checked) now;
    None finds and reads the ambient workspace on first use only, with the
    `environ` and `cwd` of this call, so loading a local MLTable of local files
    never reads (or trips over) an unrelated workspace file.
    """
    if _ambient(value):
        env, where = dict(environ), cwd
        return functools.cache(lambda: workspace_from(None, env, where, missing_ok=True))
    workspace = workspace_from(value, environ, cwd, missing_ok=True)
    return lambda: workspace


def _ambient(value: object) -> bool:
    """None, or "" (like an empty DATAMOUNT_WORKSPACE): find the workspace."""
    return value is None or (isinstance(value, str) and not value)
