"""read_tail's end: the last entry's last message ends the replay when its batch index is known."""
from __future__ import annotations

from typing import Any, List, Tuple

import pulsar

from pulsar_lifecycle.dedup import recovery


class _Msg:
    def __init__(self, mid: pulsar.MessageId) -> None:
        self._mid = mid

    def message_id(self) -> pulsar.MessageId:
        return self._mid


class _Probe:
    def __init__(self, last: pulsar.MessageId) -> None:
        self._last = last

    def get_last_message_id(self) -> pulsar.MessageId:
        return self._last

    def unsubscribe(self) -> None:
        pass


class _Reader:
    def __init__(self, msgs: List[_Msg], waits: List[int]) -> None:
        self._msgs = list(msgs)
        self.waits = waits

    def read_next(self, timeout_millis: int) -> _Msg:
        self.waits.append(timeout_millis)
        if not self._msgs:
            raise pulsar.Timeout()
        return self._msgs.pop(0)

    def close(self) -> None:
        pass


class _Client:
    """The topic holds `entries` (ledger, entry, batch size; size 0: a message outside a batch)."""

    def __init__(self, entries: List[Tuple[int, int, int]], reported_batch_index: int) -> None:
        self.msgs = [_Msg(pulsar.MessageId(-1, ledger, entry, i)) for ledger, entry, size in entries
                     for i in (range(size) if size else [-1])]
        ledger, entry, _size = entries[-1]
        self._last = pulsar.MessageId(-1, ledger, entry, reported_batch_index)
        self.waits: List[int] = []
        self._probed = False

    def subscribe(self, *_a: Any, **_k: Any) -> _Probe:
        return _Probe(self._last)

    def create_reader(self, *_a: Any, **_k: Any) -> _Reader:
        if not self._probed:  # last_position's look for a first message: not the replay's reads
            self._probed = True
            return _Reader(self.msgs, [])
        return _Reader(self.msgs, self.waits)


def _replay(client: _Client) -> Tuple[int, List[int]]:
    stats = recovery.read_tail(client, "persistent://t/n/x", None, lambda _m: True)  # type: ignore[arg-type]
    return stats.messages_read, client.waits


def test_a_known_last_batch_index_ends_the_replay_with_that_message() -> None:
    # Apache Pulsar: the last message id carries the entry's largest batch index.
    read, waits = _replay(_Client([(3, 0, 5), (3, 1, 4)], reported_batch_index=3))
    assert read == 9
    assert len(waits) == 9  # no read after the last message: nothing waits END_DRAIN_MS for more


def test_a_single_message_entry_ends_the_replay() -> None:
    read, waits = _replay(_Client([(3, 0, 5), (3, 1, 0)], reported_batch_index=-1))
    assert read == 6
    assert len(waits) == 6


def test_an_unknown_batch_size_drains_the_last_entry() -> None:
    # pulsar-lite: a batch entry's last message id has batch index -1; the whole batch is read.
    read, waits = _replay(_Client([(3, 0, 5), (3, 1, 4)], reported_batch_index=-1))
    assert read == 9
    assert len(waits) == 10 and waits[-1] == recovery.END_DRAIN_MS  # one more read, timed out
