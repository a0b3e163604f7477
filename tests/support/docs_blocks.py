"""Code blocks of the docs (docs/*.md and README.md), for tests that run what the docs show."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import yaml

from support.paths import REPO

DOC_FILES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: A block showing part of a shipped config starts `# function-configs/<file>.yaml (abridged)`.
_ABRIDGED = re.compile(r"^#\s*(function-configs/[\w./-]+\.ya?ml)\s*\(abridged\)")


@dataclass(frozen=True)
class DocBlock:
    """One fenced block: its file, line, language and text."""

    path: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        """`docs/x.md:12`, for test ids and messages."""
        return f"{self.path.relative_to(REPO)}:{self.line}"

    def abridges(self) -> Optional[Path]:
        """The shipped config an abridged block shows part of, or None for a whole config."""
        m = _ABRIDGED.match(self.text.lstrip())
        return REPO / m.group(1) if m else None


def doc_blocks(lang: str, files: Optional[List[Path]] = None) -> List[DocBlock]:
    """Every fenced block of `lang` (```yaml, ```bash, ...) in the docs, in file order."""
    out = []
    for path in files or DOC_FILES:
        text = path.read_text()
        for m in _FENCE.finditer(text):
            if m.group(1) == lang:
                out.append(DocBlock(path, text.count("\n", 0, m.start()) + 1, lang, m.group(2)))
    return out


def overlay(base: Mapping[str, Any], part: Mapping[str, Any]) -> Dict[str, Any]:
    """`base` with `part` laid over it, mappings merged key by key (an abridged block's keys)."""
    out = dict(base)
    for key, value in part.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = overlay(out[key], value)
        else:
            out[key] = value
    return out


def config_of(block: DocBlock) -> Dict[str, Any]:
    """The function config a YAML block shows: itself, or laid over the shipped config it abridges."""
    part = yaml.safe_load(block.text) or {}
    base = block.abridges()
    return overlay(yaml.safe_load(base.read_text()), part) if base is not None else dict(part)
