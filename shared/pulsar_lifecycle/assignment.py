"""Which partitions a function instance owns: a pure rule shared by every function that splits
partitioned work across its instances (`context.get_instance_id()` of `parallelism`).

Partition k belongs to instance `k % num_instances`. The rule depends only on k and the instance
count, so every instance computes the same split without talking to the others, and a partition
appended later (partition discovery) lands on the same instance whoever discovers it.
"""
from __future__ import annotations

from typing import Iterable, List

from .exceptions import PulsarLifecycleError

__all__ = ["AssignmentError", "is_owned", "owned_partitions", "owner_of"]


class AssignmentError(PulsarLifecycleError, ValueError):
    """An instance id or instance count that cannot split partitions."""


def _check(instance_id: int, num_instances: int) -> None:
    if num_instances < 1:
        raise AssignmentError(f"instance count {num_instances} must be >= 1")
    if not 0 <= instance_id < num_instances:
        raise AssignmentError(f"instance id {instance_id} is outside 0..{num_instances - 1} "
                              f"(the function's parallelism is {num_instances})")


def owner_of(partition: int, num_instances: int) -> int:
    """The instance that owns `partition`."""
    if partition < 0:
        raise AssignmentError(f"partition {partition} must be >= 0")
    _check(0, num_instances)
    return partition % num_instances


def is_owned(partition: int, instance_id: int, num_instances: int) -> bool:
    """True when instance `instance_id` of `num_instances` owns `partition`."""
    _check(instance_id, num_instances)
    return owner_of(partition, num_instances) == instance_id


def owned_partitions(partitions: Iterable[int], instance_id: int, num_instances: int) -> List[int]:
    """The partitions of `partitions` (e.g. `range(n)`) that instance `instance_id` owns, in order."""
    _check(instance_id, num_instances)
    return [k for k in partitions if owner_of(k, num_instances) == instance_id]
