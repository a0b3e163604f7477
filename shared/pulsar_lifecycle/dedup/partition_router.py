"""Which partition of a partitioned topic a message goes to: a pure function of the message.

Pulsar's producers route a keyed message by a hash of its partition key modulo the partition
count (Java: `RoundRobinPartitionMessageRouterImpl.choosePartition`, `signSafeMod(hash.makeHash(key),
numPartitions)`; C++: `RoundRobinMessageRouter::getPartition`, `makeHash(key) % numPartitions`), so
a released message with a key lands where the producers of that topic put its undelayed messages
with the same key, and per-key order holds. Which hash depends on the client:

- `java_string` — Java's `String.hashCode() & Integer.MAX_VALUE` over UTF-16 code units: the
  Java client's default (`ProducerConfigurationData.hashingScheme = JavaStringHash`), so also
  `pulsar-client produce`, Java functions and connectors. The default here.
- `murmur3_32` — Java's `Murmur3_32Hash` (MurmurHash3 x86 32-bit, seed 0, over the key's UTF-8
  bytes, `& Integer.MAX_VALUE`): what a Java producer built with `hashingScheme(Murmur3_32Hash)`
  and a C++ producer configured with `Murmur3_32Hash` use.
- The C++ client's own default (`BoostHash`, also what pulsar-client for Python uses: its
  `create_producer` has no hashing setting) is `boost::hash<std::string>`, whose values depend on
  the Boost release the wheel was built with. It is not reproducible, so it is not offered; a
  Python producer that wants the same partitions as the writer passes
  `message_router=java_string_router` (below) to `create_producer`.

A message without a key is routed from its sequence id (the identity de-duplication already
requires to be the same on every replay): spread evenly, and the same partition after a crash.
The partition count used for each sequence id is decided by `RoutingHistory` (publisher.py keeps
it durable), so a count that grows between a release and its replay changes nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

import mmh3

__all__ = [
    "KEY_HASHINGS",
    "DEFAULT_KEY_HASHING",
    "RoutingError",
    "RoutingHistory",
    "choose_partition",
    "java_string_hash",
    "java_string_router",
    "murmur3_32_hash",
]

_INT_MAX = 0x7FFF_FFFF


class RoutingError(ValueError):
    """A routing setting or a stored routing history that cannot be used."""


def java_string_hash(key: str) -> int:
    """Java's `key.hashCode() & Integer.MAX_VALUE` (Pulsar's JavaStringHash)."""
    h = 0
    data = key.encode("utf-16-be", "surrogatepass")  # Java strings are UTF-16 code units
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFF_FFFF
    return h & _INT_MAX


def murmur3_32_hash(key: str) -> int:
    """Pulsar's Murmur3_32Hash: MurmurHash3 x86_32, seed 0, of the UTF-8 bytes, `& Integer.MAX_VALUE`."""
    return mmh3.hash(key.encode("utf-8"), 0, signed=False) & _INT_MAX


KEY_HASHINGS = {"java_string": java_string_hash, "murmur3_32": murmur3_32_hash}
DEFAULT_KEY_HASHING = "java_string"


def _seq_hash(seq: int) -> int:
    # Sequence ids of one publisher often share their low bits (positions with batch index 0):
    # mixed, not taken modulo directly.
    return mmh3.hash(int(seq).to_bytes(8, "big"), 0, signed=False) & _INT_MAX


def key_hasher(name: str) -> Callable[[str], int]:
    """The hash function of a `keyHashing` setting, or RoutingError naming the choices."""
    try:
        return KEY_HASHINGS[name]
    except KeyError:
        raise RoutingError(f"unknown key hashing {name!r}: expected one of {sorted(KEY_HASHINGS)}") from None


def choose_partition(key: Optional[str], seq: int, partitions: int, key_hash: Callable[[str], int] = java_string_hash) -> int:
    """The partition (0..partitions-1) of a message: by its key's hash when it has a key, else by its
    sequence id. An empty key counts as none, as in Pulsar's clients (`hasKey` / `hasPartitionKey`)."""
    if partitions < 1:
        raise RoutingError(f"a partitioned topic has at least 1 partition, got {partitions}")
    if key:
        return key_hash(key) % partitions
    return _seq_hash(seq) % partitions


def java_string_router(msg: Any, num_partitions: int) -> int:
    """A `message_router` for pulsar-client (Python)'s `create_producer`: routes keyed messages as
    Java's default does (and as the writer releases them), unkeyed ones to partition 0."""
    key = msg.partition_key() if hasattr(msg, "partition_key") else None
    return java_string_hash(key) % num_partitions if key else 0


@dataclass(frozen=True)
class RoutingEpoch:
    """From sequence id `from_seq` on, the topic is routed over `partitions` partitions."""

    from_seq: int
    partitions: int


class RoutingHistory:
    """The partition counts a publisher has routed one topic over, each from the sequence id it was
    first used for. A sequence id is always routed with the count in force at that id, so a replay
    after a crash picks the partition the first attempt picked, whatever the count is now."""

    def __init__(self, epochs: Optional[List[RoutingEpoch]] = None) -> None:
        self.epochs: List[RoutingEpoch] = list(epochs or [])
        for a, b in zip(self.epochs, self.epochs[1:]):
            if b.from_seq <= a.from_seq or b.partitions < a.partitions:
                raise RoutingError(f"routing history out of order: {a} then {b}")

    @property
    def partitions(self) -> int:
        """The newest partition count (0 before the first)."""
        return self.epochs[-1].partitions if self.epochs else 0

    def partitions_at(self, seq: int) -> int:
        """The partition count in force at sequence id `seq`."""
        count = self.epochs[0].partitions if self.epochs else 0
        for e in self.epochs:
            if e.from_seq > seq:
                break
            count = e.partitions
        return count

    def grow(self, partitions: int, from_seq: int) -> bool:
        """Route over `partitions` from `from_seq` on; False when nothing changes. A count that
        shrinks is refused (Pulsar never removes partitions)."""
        if self.epochs and partitions == self.partitions:
            return False
        if self.epochs and partitions < self.partitions:
            raise RoutingError(f"partition count went down from {self.partitions} to {partitions}")
        if self.epochs and from_seq <= self.epochs[-1].from_seq:
            # Nothing was sent with the previous count: replace it.
            self.epochs[-1] = RoutingEpoch(self.epochs[-1].from_seq, partitions)
        else:
            self.epochs.append(RoutingEpoch(from_seq, partitions))
        return True

    def to_bytes(self) -> bytes:
        """The history as stored (JSON: a list of [from_seq, partitions])."""
        return json.dumps([[e.from_seq, e.partitions] for e in self.epochs]).encode("utf-8")

    @classmethod
    def from_bytes(cls, raw: bytes) -> "RoutingHistory":
        """A stored history, or RoutingError when it is not one."""
        try:
            items = json.loads(raw.decode("utf-8"))
            epochs = [RoutingEpoch(int(s), int(n)) for s, n in items]
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            raise RoutingError(f"unreadable routing history: {exc}") from exc
        return cls(epochs)

    def route(self, key: Optional[str], seq: int, key_hash: Callable[[str], int]) -> int:
        """The partition of one message (its key, its sequence id)."""
        return choose_partition(key, seq, self.partitions_at(seq), key_hash)

    def __repr__(self) -> str:
        return f"RoutingHistory({[(e.from_seq, e.partitions) for e in self.epochs]})"

