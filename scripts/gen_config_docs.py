#!/usr/bin/env python3
"""Regenerate the userConfig tables of docs/configuration.md from the config dataclasses.

    .venv/bin/python scripts/gen_config_docs.py          # rewrite the tables in place
    .venv/bin/python scripts/gen_config_docs.py --check  # exit 1 naming the stale ones
"""
from __future__ import annotations

import sys
from pathlib import Path

from pulsar_lifecycle.cli.docs_reference import render, stale_sections

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def main(argv: list) -> int:
    """Rewrite (or with --check, only compare) the generated tables; 1 when --check finds a difference."""
    if "--check" in argv:
        stale = stale_sections(DOC)
        if stale:
            print(f"{DOC}: userConfig tables out of date for {stale}; run scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(render(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
