"""The partition-to-instance rule (pulsar_lifecycle.assignment) and the instance count read from
the Context (runtime.context_api.instance_count)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pulsar_lifecycle.assignment import AssignmentError, is_owned, owned_partitions, owner_of
from pulsar_lifecycle.runtime.context_api import instance_count


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_every_partition_has_exactly_one_owner(n):
    parts = range(30)
    split = [owned_partitions(parts, i, n) for i in range(n)]
    assert sorted(k for owned in split for k in owned) == list(parts)
    assert all(is_owned(k, i, n) == (k in split[i]) for i in range(n) for k in parts)


def test_appended_partitions_follow_the_same_rule():
    # Discovery appends partitions 30..33: each goes where the rule over the whole range puts it.
    assert owned_partitions(range(30, 34), 1, 3) == [k for k in owned_partitions(range(34), 1, 3) if k >= 30] == [31]
    assert [owner_of(k, 3) for k in range(30, 34)] == [0, 1, 2, 0]


@pytest.mark.parametrize("instance, n", [(2, 2), (-1, 2), (0, 0)])
def test_an_instance_outside_the_count_is_refused(instance, n):
    with pytest.raises(AssignmentError, match="instance"):
        owned_partitions(range(4), instance, n)


def test_instance_count_prefers_the_context_then_function_details_then_config():
    assert instance_count(SimpleNamespace(get_num_instances=lambda: 3), 1) == 3
    # Pulsar's Python ContextImpl: no get_num_instances, FunctionDetails.parallelism in instance_config.
    details = SimpleNamespace(instance_config=SimpleNamespace(function_details=SimpleNamespace(parallelism=4)))
    assert instance_count(details, 1) == 4
    unset = SimpleNamespace(instance_config=SimpleNamespace(function_details=SimpleNamespace(parallelism=0)))
    assert instance_count(unset, 2) == 2
    assert instance_count(object(), 5) == 5
