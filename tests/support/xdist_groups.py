"""`--dist loadgroup` that works (registered by tests/conftest.py): tests marked
`xdist_group(name)` run on one xdist worker, one after another, so they share the module- and
session-scoped fixtures they use (a real function worker's standalone, the secured standalone).

pytest-xdist groups a test by appending `@name` to its node id on each worker, which it does by
assigning `item._nodeid`. pytest 9 keeps the id in `item._id` (a NodeId) instead, so that
assignment changes nothing: every marked test was dealt out alone, and each xdist worker that got
one of a module's tests started the module's standalone for itself (the deploy example's worker
standalone and its deploy ran twice in one CI run). This hook adds the suffix the way this pytest
stores ids, after xdist's own hook, and leaves ids alone where xdist's assignment took effect.
"""
from __future__ import annotations

from typing import List

import pytest


def group_suffix(item: pytest.Item) -> str:
    """`@name` for a test marked xdist_group (several marks: names sorted, joined by `_`, as xdist
    does); '' for an unmarked test."""
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return f"@{'_'.join(sorted(names))}" if names else ""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    # xdist sets option.loadgroup on its workers (`--dist loadgroup`); the controller schedules by
    # the ids the workers report.
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        suffix = group_suffix(item)
        if not suffix or item.nodeid.endswith(suffix):
            continue
        node_id = getattr(item, "_id", None)
        if node_id is not None and hasattr(type(node_id), "parse"):
            item._id = type(node_id).parse(item.nodeid + suffix)
        else:
            item._nodeid = item.nodeid + suffix
        if not item.nodeid.endswith(suffix):
            raise pytest.UsageError(f"cannot add the xdist group {suffix} to the node id of {item.nodeid}")
