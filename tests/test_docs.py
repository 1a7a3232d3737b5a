"""The docs stay true to the code: every generated page (docs/commands.md from the
parser, docs/configuration.md from the settings, docs/benchmarks.md from the
benchmark records) equals what scripts/gendocs.py generates now, and the README
stays a front page whose links all lead somewhere."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_MAX_LINES = 250
# [text](target) and <img src="target">; a target ends at whitespace or ")".
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<img[^>]+src=\"([^\"]+)\"")


def _gendocs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gendocs", REPO / "scripts" / "gendocs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gendocs", module)
    spec.loader.exec_module(module)
    return module


GENDOCS = _gendocs()
PAGES = GENDOCS.pages()


@pytest.mark.parametrize("page", sorted(PAGES))
def test_generated_page_is_current(page: str) -> None:
    path = REPO / page
    assert path.exists(), f"{page} is missing: run .venv/bin/python scripts/gendocs.py"
    assert path.read_text() == PAGES[page], (
        f"{page} is stale (a command, a setting or a benchmark record changed): "
        "run .venv/bin/python scripts/gendocs.py"
    )


def test_gendocs_check_passes() -> None:
    assert GENDOCS.main(["--check"]) == 0


def test_gendocs_is_deterministic() -> None:
    assert GENDOCS.pages() == PAGES


def test_every_setting_is_on_the_configuration_page() -> None:
    from datamount.settings import Settings

    page = PAGES["docs/configuration.md"]
    for name, field in Settings.model_fields.items():
        assert f"| `{field.alias or name.upper()}` |" in page, name


def test_every_command_is_on_the_commands_page() -> None:
    from datamount.cli.parser import build_parser

    page = PAGES["docs/commands.md"]
    for command, _, _ in GENDOCS._subcommands(build_parser()):
        assert f"## datamount {command}\n" in page, command


def test_readme_is_a_front_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MAX_LINES}: move the detail to docs/"
    )


def test_readme_links_only_to_files_that_exist() -> None:
    missing = []
    for match in LINK.finditer(README.read_text()):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor of the README itself
        path = target.split("#", 1)[0]
        if not (README.parent / path).exists():
            missing.append(target)
    assert not missing, f"README.md links to files that do not exist: {missing}"
