"""Glob patterns over object keys, and partition formats over file paths.

Pure string work, no I/O. A pattern is matched against whole keys
('/'-separated): `*` is any run of characters except '/', `?` one character
except '/', `[abc]` / `[a-z]` / `[!a]` (or `[^a]`) one character of a class,
`**` any run of characters including '/' (`a/**/b` also matches `a/b`). The
longest fixed prefix (everything before the first wildcard) is what gets
listed, so a pattern never lists more of a container than it must.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

WILDCARDS = "*?["


def fixed_prefix(pattern: str) -> str:
    """The characters before the first wildcard (may end mid-name)."""
    cut = min((i for i in (pattern.find(c) for c in WILDCARDS) if i >= 0), default=len(pattern))
    return pattern[:cut]


def has_wildcards(pattern: str) -> bool:
    return any(c in pattern for c in WILDCARDS)


def needs_recursion(pattern: str) -> bool:
    """True when matches may sit below the folder of the fixed prefix: a `**`,
    or a wildcard in a folder segment. Otherwise one delimited listing level suffices."""
    prefix = fixed_prefix(pattern)
    return "**" in pattern or "/" in pattern[len(prefix) :]


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex matching whole keys; ValueError on a malformed pattern."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            if pattern.startswith("**", i):
                i += 2
                if i < n and pattern[i] == "*":
                    raise ValueError("'***' is not a valid wildcard")
                if i < n and pattern[i] == "/":  # '**/' : zero or more folders
                    out.append("(?:.*/)?")
                    i += 1
                else:
                    out.append(".*")
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^", "]") else i + 1)
            if end < 0:
                raise ValueError("unclosed '[' in character class")
            body = pattern[i + 1 : end]
            negate = body[:1] in ("!", "^")
            if negate:
                body = body[1:]
            if not body:
                raise ValueError("empty character class '[]'")
            if "/" in body:
                raise ValueError("'/' cannot appear in a character class")
            for m in re.finditer(r"(.)-(.)", body):
                if m.group(1) > m.group(2):
                    raise ValueError(f"bad range {m.group(0)!r} in character class")
            escaped = body.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
            out.append(f"[{'^/' if negate else ''}{escaped}]")
            i = end
        elif c == "]":
            raise ValueError("']' without a matching '['")
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


# -- partition formats -----------------------------------------------------

_PART = re.compile(r"\{([^{}:]+)(?::([^{}]+))?\}")
_DT_TOKENS = {"yyyy": r"\d{4}", "MM": r"\d{2}", "dd": r"\d{2}", "HH": r"\d{2}", "mm": r"\d{2}"}
_DT_TOKENS["ss"] = r"\d{2}"
_DT_TOKEN = re.compile("yyyy|MM|dd|HH|mm|ss")


@dataclass(frozen=True)
class PartitionFormat:
    """`{name}` parts become string columns, `{name:yyyy/MM/dd/HH/mm/ss}` parts
    datetime columns; the format is matched against the end of a file's path
    (Azure ML: it runs from the first partition key to the end of the path)."""

    text: str
    regex: re.Pattern[str]
    columns: tuple[tuple[str, str | None], ...]  # (name, datetime format or None)

    @classmethod
    def parse(cls, text: str) -> PartitionFormat:
        out: list[str] = []
        columns: list[tuple[str, str | None]] = []
        pos = 0
        for m in _PART.finditer(text):
            out.append(re.escape(text[pos : m.start()]))
            name, fmt = m.group(1).strip(), m.group(2)
            if not name or name in (c for c, _ in columns):
                raise ValueError(f"{text!r}: column {name!r} is empty or repeated")
            group = f"g{len(columns)}"
            if fmt is None:
                out.append(f"(?P<{group}>[^/]+)")
            else:
                if not _DT_TOKEN.search(fmt):
                    raise ValueError(f"{text!r}: {fmt!r} has none of yyyy MM dd HH mm ss")
                sub, fpos = [], 0
                for t in _DT_TOKEN.finditer(fmt):
                    sub.append(re.escape(fmt[fpos : t.start()]))
                    sub.append(_DT_TOKENS[t.group(0)])
                    fpos = t.end()
                sub.append(re.escape(fmt[fpos:]))
                out.append(f"(?P<{group}>{''.join(sub)})")
            columns.append((name, fmt))
            pos = m.end()
        rest = text[pos:]
        if "{" in rest or "}" in rest or not columns:
            raise ValueError(f"{text!r}: expected parts such as {{name}} or {{name:yyyy/MM/dd}}")
        out.append(re.escape(rest))
        body = "".join(out).lstrip("/").removeprefix("\\/")
        # Anchored at the end of the path, starting at a folder boundary. A
        # format ending in '/' or in a part ('{year}/{month}') names folders:
        # the file name after it is allowed.
        tail = "[^/]*" if text.endswith("/") else "(?:/[^/]+)?" if text.endswith("}") else ""
        return cls(text, re.compile(f"(?:^|/){body}{tail}\\Z"), tuple(columns))

    def extract(self, path: str) -> dict[str, object] | None:
        """Column values for one file path, or None when it does not match."""
        m = self.regex.search(path.lstrip("/"))
        if m is None:
            return None
        values: dict[str, object] = {}
        for i, (name, fmt) in enumerate(self.columns):
            raw = m.group(f"g{i}")
            values[name] = raw if fmt is None else _datetime(raw, fmt)
        return values


def _datetime(raw: str, fmt: str) -> datetime | None:
    py = _DT_TOKEN.sub(
        lambda t: {"yyyy": "%Y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M", "ss": "%S"}[
            t.group(0)
        ],
        fmt.replace("%", "%%"),
    )
    try:
        return datetime.strptime(raw, py)
    except ValueError:
        return None
