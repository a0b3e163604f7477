"""Which scheduling partitions a writer instance owns (pure: no Pulsar I/O).

A partitioned scheduling topic `<topic>` has partitions `<topic>-partition-<k>`, addressed by
name (as Pulsar names them, and as the embedded broker needs them). Instance `i` of `n` owns the
partitions `k` with `k % n == i`: every partition has exactly one intended owner, the split
depends only on (partition count, instance count), so each instance computes it alone, and a
partition's state (index, snapshot namespace, dedup producer, watermark) is named after the
partition, never after the instance: whoever owns it next finds it. Which owner may actually
write is decided by the partition's lease in the snapshot store (bucket/storage/lease.py), so a
wrong or stale instance count costs waiting, never two writers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..topics import TopicName

__all__ = ["PartitionAssignment", "assign_partitions", "partition_label"]


def partition_label(index: int) -> str:
    """`partition-<k>`: the name of a partition's snapshot namespace, dedup state and producer suffix."""
    return f"partition-{int(index)}"


def assign_partitions(partitions: int, instance_id: int, num_instances: int) -> Tuple[int, ...]:
    """The partitions instance `instance_id` of `num_instances` owns: `k % num_instances == instance_id`.

    Raises ValueError naming the bad value. An instance id at or past the partition count owns
    nothing (more instances than partitions: the extra ones stay idle).
    """
    for name, value, low in (("partitions", partitions, 1), ("num_instances", num_instances, 1),
                             ("instance_id", instance_id, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if instance_id >= num_instances:
        raise ValueError(f"instance_id {instance_id} is not below num_instances {num_instances}")
    return tuple(range(instance_id, partitions, num_instances))


@dataclass(frozen=True)
class PartitionAssignment:
    """One instance's share of a partitioned scheduling topic."""

    topic: TopicName  # the partitioned topic (no -partition- suffix)
    partitions: int
    instance_id: int
    num_instances: int

    @property
    def owned(self) -> Tuple[int, ...]:
        """Partition indexes this instance owns."""
        return assign_partitions(self.partitions, self.instance_id, self.num_instances)

    def topic_of(self, index: int) -> str:
        """Full name of partition `index`."""
        if not 0 <= index < self.partitions:
            raise ValueError(f"partition {index} out of range 0..{self.partitions - 1} of {self.topic.full_name}")
        return self.topic.with_partition(index).full_name
