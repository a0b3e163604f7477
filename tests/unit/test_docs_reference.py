"""docs/configuration.md documents every userConfig key the functions accept: its tables are the
ones generated from the config dataclasses (scripts/gen_config_docs.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from pulsar_lifecycle.cli.docs_reference import render, section_table, stale_sections
from pulsar_lifecycle.cli.function_registry import FUNCTIONS, USER_CONFIG_KEYS
from support.paths import REPO

ROOT = REPO
DOC_PATH = ROOT / "docs" / "configuration.md"
DOC = DOC_PATH.read_text()


def test_every_user_config_key_is_documented():
    missing = [f"{fn}: {key}" for fn, keys in USER_CONFIG_KEYS.items() for key in keys if f"`{key}`" not in DOC]
    assert not missing, f"undocumented userConfig keys: {missing}"


@pytest.mark.parametrize("entry", FUNCTIONS, ids=[e.title for e in FUNCTIONS])
def test_table_matches_the_config_fields(entry):
    # Regenerate with `scripts/gen_config_docs.py` when a key, default, bound or meaning changes.
    assert section_table(entry.class_name) in DOC
    assert entry.class_name not in stale_sections(DOC_PATH)


def test_a_changed_field_makes_the_docs_stale(tmp_path):
    # The check can fail: a table edited by hand (here a default) no longer matches.
    edited = tmp_path / "configuration.md"
    edited.write_text(DOC.replace("| `tickTimeMillis` | `1000` |", "| `tickTimeMillis` | `999` |", 1))
    assert stale_sections(edited) == ["bucket_snapshot_writer.BucketSnapshotWriter"]
    assert render(edited.read_text()) == DOC


def test_generator_check_passes_on_the_shipped_docs():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_config_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
