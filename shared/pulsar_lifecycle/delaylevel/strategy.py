"""`DelayLevelTopicPartitionStrategy` (seed 002): how many partitions a delay-level topic has and
which one a delay goes to. Pure: no Pulsar I/O.

Partition k holds delays in [k+1, k+2) units (the seed's relative slices); a delay shorter than
one unit takes the near-term path. The partition count is floor(max delay / unit), so a delay of
exactly the maximum is accepted (the seed's 1-year/DAY example has 364 partitions and so refuses
exactly 365 days; we give it 365).

YEAR and MONTH are fixed lengths (365 and 30 days): a relative slice needs one length, and a
calendar month has four.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from .errors import DelayTooLongError, StrategyError

__all__ = [
    "DEFAULT_MAX_DELAY_SECONDS",
    "DEFAULT_MAX_PARTITIONS",
    "DelayTooLongError",
    "DelayLevelTopicPartitionStrategy",
    "PartitionBy",
    "StrategyError",
]

DEFAULT_MAX_DELAY_SECONDS = 60 * 60 * 24 * 30  # the seed's messageMaximumDelayTimeSeconds
DEFAULT_MAX_PARTITIONS = 1000


class PartitionBy(str, enum.Enum):
    """The seed's units, plus SECONDS (a unit of `unit_seconds`, for tests and finer levels)."""

    YEAR = "YEAR"
    MONTH = "MONTH"
    DAY = "DAY"
    HOUR = "HOUR"
    SECONDS = "SECONDS"


_UNIT_SECONDS = {
    PartitionBy.YEAR: 365 * 86400,
    PartitionBy.MONTH: 30 * 86400,
    PartitionBy.DAY: 86400,
    PartitionBy.HOUR: 3600,
}



@dataclass(frozen=True)
class DelayLevelTopicPartitionStrategy:
    """Partitioning of a delay-level topic by delay.

    Args:
        message_maximum_delay_time_seconds: longest delay accepted (seed default 30 days).
        partition_by: the unit of one partition.
        unit_seconds: the unit's length when `partition_by` is SECONDS (any whole number >= 1).
        max_partitions: cap on the partition count; above it the strategy is refused.
    """

    message_maximum_delay_time_seconds: int = DEFAULT_MAX_DELAY_SECONDS
    partition_by: PartitionBy = PartitionBy.DAY
    unit_seconds: Optional[int] = None
    max_partitions: int = DEFAULT_MAX_PARTITIONS

    def __post_init__(self) -> None:
        try:
            by = PartitionBy(self.partition_by)
        except ValueError:
            raise StrategyError(f"partitionBy must be one of {[p.value for p in PartitionBy]}, "
                                f"got {self.partition_by!r}") from None
        object.__setattr__(self, "partition_by", by)
        if by is PartitionBy.SECONDS:
            if not isinstance(self.unit_seconds, int) or isinstance(self.unit_seconds, bool) or self.unit_seconds < 1:
                raise StrategyError(f"partitionBy SECONDS needs unitSeconds >= 1 (a whole number), got {self.unit_seconds!r}")
        elif self.unit_seconds not in (None, _UNIT_SECONDS[by]):
            raise StrategyError(f"unitSeconds={self.unit_seconds!r} contradicts partitionBy {by.value} "
                                f"({_UNIT_SECONDS[by]} s); use partitionBy SECONDS for another unit")
        if not isinstance(self.message_maximum_delay_time_seconds, int) or self.message_maximum_delay_time_seconds < 1:
            raise StrategyError(f"messageMaximumDelayTimeSeconds must be a whole number >= 1, "
                                f"got {self.message_maximum_delay_time_seconds!r}")
        if not isinstance(self.max_partitions, int) or self.max_partitions < 1:
            raise StrategyError(f"maxPartitions must be >= 1, got {self.max_partitions!r}")
        if self.partitions < 1:
            raise StrategyError(f"{self}: the maximum delay is shorter than one unit, so no delay-level partition "
                                "would ever be used; send with a plain delayed producer instead")
        if self.partitions > self.max_partitions:
            raise StrategyError(f"{self}: {self.partitions} partitions exceed the cap of {self.max_partitions}; "
                                "choose a coarser partitionBy, a shorter maximum delay, or raise maxPartitions")

    def __str__(self) -> str:
        unit = f"SECONDS({self.unit_seconds})" if self.partition_by is PartitionBy.SECONDS else self.partition_by.value
        return (f"DelayLevelTopicPartitionStrategy(messageMaximumDelayTimeSeconds="
                f"{self.message_maximum_delay_time_seconds}, partitionBy={unit})")

    @property
    def unit_ms(self) -> int:
        """Length of one unit in milliseconds."""
        secs = self.unit_seconds if self.partition_by is PartitionBy.SECONDS else _UNIT_SECONDS[self.partition_by]
        assert secs is not None
        return secs * 1000

    @property
    def max_delay_ms(self) -> int:
        """The longest accepted delay in milliseconds."""
        return self.message_maximum_delay_time_seconds * 1000

    @property
    def partitions(self) -> int:
        """Partition count: floor(max delay / unit); partition k holds [k+1, k+2) units."""
        return self.max_delay_ms // self.unit_ms

    def partition_for(self, delay_ms: int) -> Optional[int]:
        """The partition of a delay, or None for the near-term path (less than one unit, or
        a deliver-at already past). A delay above the maximum raises DelayTooLongError."""
        if delay_ms > self.max_delay_ms:
            raise DelayTooLongError(f"delay of {delay_ms} ms exceeds the maximum of {self.max_delay_ms} ms of {self}")
        if delay_ms < self.unit_ms:
            return None
        return min(delay_ms // self.unit_ms - 1, self.partitions - 1)
