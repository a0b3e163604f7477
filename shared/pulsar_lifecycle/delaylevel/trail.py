"""`ForwardTrail`: where on the near-term topic a forwarded parked message can be looked for. Pure.

A cancel that arrives after its parked message was forwarded must follow it into the writer's
index, whose cancel protocol names scheduling-topic positions (`__pl_cancel__`). The syncer does
not record a position per forward (memory would grow with the traffic); it records checkpoints:
every so often the near-term topic's last position, then each partition's highest claimed
sequence id. A forward of sequence id `seq` in partition k that was not claimed at a checkpoint
is published after that checkpoint's position (position read first, claims second), so a scan
of the near-term topic from the latest such checkpoint finds it. Checkpoints older than the
longest time a forward can wait in the near-term index (one unit + lookahead, doubled for margin)
are dropped: a forward older than that has been released and can no longer be cancelled.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from .errors import TrailFormatError

__all__ = ["Checkpoint", "ForwardTrail", "TrailFormatError"]

_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """The near-term topic's last (ledger, entry) at `taken_at_ms`, then each partition's claim."""

    taken_at_ms: int
    position: Optional[Tuple[int, int]]  # None: the topic was empty (scan from its start)
    claimed: Dict[int, int]  # partition -> highest sequence id claimed for forwarding (-1: none)
    # A partitioned near-term topic: its partitions' last (ledger, entry) (`position` is None).
    positions: Dict[int, Optional[Tuple[int, int]]] = field(default_factory=dict)


@dataclass
class ForwardTrail:
    """Checkpoints, oldest first, kept for `retention_ms` and at most `max_checkpoints`."""

    retention_ms: int
    max_checkpoints: int = 200
    checkpoints: List[Checkpoint] = field(default_factory=list)

    @property
    def interval_ms(self) -> int:
        """How often a checkpoint is due: the retention spread over the checkpoints (>= 5 s)."""
        return max(5000, self.retention_ms // self.max_checkpoints)

    def due(self, now_ms: int) -> bool:
        """True when no checkpoint was taken in the last `interval_ms`."""
        return not self.checkpoints or now_ms - self.checkpoints[-1].taken_at_ms >= self.interval_ms

    def add(self, checkpoint: Checkpoint) -> None:
        """Append a checkpoint and drop those no longer needed."""
        self.checkpoints.append(checkpoint)
        horizon = checkpoint.taken_at_ms - self.retention_ms
        # Keep the newest checkpoint older than the horizon: it still bounds the scans after it.
        while len(self.checkpoints) > 1 and self.checkpoints[1].taken_at_ms <= horizon:
            self.checkpoints.pop(0)
        del self.checkpoints[:-self.max_checkpoints]

    def scan_start(self, partition: int, seq: int) -> Tuple[bool, Optional[Tuple[int, int]]]:
        """(found, position): where to start looking for the forward of `seq` in `partition`.

        found False: every checkpoint already claimed it, so it was forwarded before the oldest
        one (released long ago, or before the trail existed). Otherwise the position of the
        latest checkpoint that had not claimed it (None = the topic's start)."""
        found, cp = self.scan_checkpoint(partition, seq)
        return found, cp.position if cp is not None else None

    def scan_checkpoint(self, partition: int, seq: int) -> Tuple[bool, Optional[Checkpoint]]:
        """`scan_start`'s checkpoint itself (None: the topic's start), for its `positions`."""
        for cp in reversed(self.checkpoints):
            if cp.claimed.get(partition, -1) < seq:
                return True, cp
        return False, None

    def to_bytes(self) -> bytes:
        """JSON for the state store."""
        return json.dumps({"v": _VERSION, "checkpoints": [
            [cp.taken_at_ms, list(cp.position) if cp.position else None, {str(k): v for k, v in cp.claimed.items()}]
            + ([{str(p): list(at) if at else None for p, at in cp.positions.items()}] if cp.positions else [])
            for cp in self.checkpoints]}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, retention_ms: int, max_checkpoints: int = 200) -> "ForwardTrail":
        """Read a stored trail; TrailFormatError names what is wrong."""
        try:
            data = json.loads(raw)
            if data.get("v") != _VERSION:
                raise TrailFormatError(f"forward trail version {data.get('v')!r}, expected {_VERSION}")
            cps = [Checkpoint(int(row[0]), (int(row[1][0]), int(row[1][1])) if row[1] else None,
                              {int(k): int(v) for k, v in row[2].items()},
                              {int(p): (int(at[0]), int(at[1])) if at else None for p, at in row[3].items()}
                              if len(row) > 3 else {})
                   for row in data["checkpoints"]]
        except TrailFormatError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise TrailFormatError(f"unreadable forward trail: {exc}") from exc
        return cls(retention_ms, max_checkpoints, cps)
