"""Renders the userConfig tables of docs/configuration.md from the config classes' fields.

Each table stands between `<!-- userConfig: <className> -->` and `<!-- /userConfig -->`; the prose
around them is written by hand. `scripts/gen_config_docs.py` rewrites the tables (or, with
--check, fails when they differ); tests/unit/test_docs_reference.py runs the check.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List

from ..config.settings import settings_table
from .function_registry import FUNCTIONS

__all__ = ["render", "section_table", "stale_sections"]

_SECTION = re.compile(r"(<!-- userConfig: (?P<cls>[\w.]+) -->\n)(?P<body>.*?)(<!-- /userConfig -->)", re.S)


def section_table(class_name: str) -> str:
    """The generated userConfig table of one shipped function (Markdown, no trailing newline)."""
    entry = next(e for e in FUNCTIONS if e.class_name == class_name)
    return settings_table(*entry.configs)


def render(doc: str) -> str:
    """`doc` with every marked table regenerated; a function without a marked section is an error."""
    found = {m.group("cls") for m in _SECTION.finditer(doc)}
    missing = [e.class_name for e in FUNCTIONS if e.class_name not in found]
    if missing:
        raise ValueError(f"docs/configuration.md has no `<!-- userConfig: ... -->` section for {missing}")
    return _SECTION.sub(lambda m: f"{m.group(1)}{section_table(m.group('cls'))}\n{m.group(4)}", doc)


def stale_sections(path: Path) -> List[str]:
    """The functions whose table in `path` differs from their config class's fields."""
    doc = path.read_text(encoding="utf-8")
    fresh = render(doc)
    old = {m.group("cls"): m.group("body") for m in _SECTION.finditer(doc)}
    new = {m.group("cls"): m.group("body") for m in _SECTION.finditer(fresh)}
    return sorted(cls for cls in new if old.get(cls) != new[cls])
