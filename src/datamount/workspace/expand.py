"""`${VAR}` in a workspace file: every string expanded from the mapping given
(never os.environ directly), each missing variable one problem naming its
key, and the names looked up recorded (the secrets a daemon must not
inherit). Pure: no I/O. No threads.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Recording(Mapping[str, str]):
    """`environ`, noting which names were looked up."""

    def __init__(self, environ: Mapping[str, str], used: set[str]) -> None:
        self._environ = environ
        self._used = used

    def __getitem__(self, name: str) -> str:
        self._used.add(name)
        return self._environ[name]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self._used.add(name)
        return name in self._environ

    def __iter__(self) -> Iterator[str]:
        return iter(self._environ)

    def __len__(self) -> int:
        return len(self._environ)


def expand(value: Any, environ: Mapping[str, str], where: str, problems: list[str]) -> Any:
    """Replace ${VAR} in every string; a missing variable is a problem naming the key."""
    if isinstance(value, dict):
        return {
            k: expand(v, environ, f"{where}.{k}" if where else str(k), problems)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [expand(v, environ, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            problems.append(f"{where}: environment variable {name} is not set")
            return ""
        return environ[name]

    return _VAR.sub(sub, value)
