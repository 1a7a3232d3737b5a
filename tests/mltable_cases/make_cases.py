"""Write the oracle corpus (tests/mltable_cases/cases.py) to a folder for
review: one folder per case, its data files and its MLTable, and an
EXPECTED.txt listing each deliberate difference with its reason.

    python tests/mltable_cases/make_cases.py DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mltable_cases.cases import CASES, write  # noqa: E402


def main(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for case in CASES:
        write(case, root)
        if case.differs:
            lines.append(f"{case.name}: {', '.join(sorted(case.differs))}: {case.reason}")
    (root / "EXPECTED.txt").write_text("\n".join(lines) + "\n")
    print(f"{len(CASES)} cases in {root}, {len(lines)} with an expected difference")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "mltable_cases_out"))
