"""docs/configuration.md documents every userConfig key the functions accept, with its default."""
from __future__ import annotations

from pathlib import Path

from pulsar_lifecycle.docs_reference import syncer_table, writer_table
from pulsar_lifecycle.function_registry import USER_CONFIG_KEYS

DOC = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()


def test_every_user_config_key_is_documented():
    missing = [f"{fn}: {key}" for fn, keys in USER_CONFIG_KEYS.items() for key in keys if f"`{key}`" not in DOC]
    assert not missing, f"undocumented userConfig keys: {missing}"


def test_writer_table_matches_the_code():
    # Regenerate with `python -m pulsar_lifecycle.docs_reference` when a key or default changes.
    assert writer_table() in DOC


def test_syncer_table_matches_the_code():
    assert syncer_table() in DOC
