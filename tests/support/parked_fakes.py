"""Fakes of a parked message and the delay-level partition's consumer, for the syncer's unit tests
(forwarder tests that need no broker)."""
from __future__ import annotations

from typing import Dict, List

import pulsar

from pulsar_lifecycle.delaylevel.rule import BASE_PROP, LEVEL_PROP
from pulsar_lifecycle.scheduling_protocol import DELIVER_AT_PROP, TARGET_PROP


class FakeId:
    def __init__(self, entry: int) -> None:
        self.entry = entry

    def ledger_id(self) -> int:
        return 7

    def entry_id(self) -> int:
        return self.entry

    def batch_index(self) -> int:
        return -1

    def serialize(self) -> bytes:
        return b""


class FakeMsg:
    def __init__(self, entry: int, target: str) -> None:
        self._id = FakeId(entry)
        self._props = {DELIVER_AT_PROP: "5000", BASE_PROP: "0", LEVEL_PROP: "0", TARGET_PROP: target}

    def message_id(self) -> FakeId:
        return self._id

    def properties(self) -> Dict[str, str]:
        return dict(self._props)  # a new dict per call, as pulsar-client's

    def data(self) -> bytes:
        return f"m{self._id.entry}".encode()

    def partition_key(self) -> str:
        return ""

    def event_timestamp(self) -> int:
        return 0


class FakeConsumer:
    def __init__(self, msgs: List[FakeMsg]) -> None:
        self.queue = list(msgs)
        self.acked: List[FakeMsg] = []

    def receive(self, timeout_millis: int = 0) -> FakeMsg:
        if not self.queue:
            raise pulsar.Timeout()
        return self.queue.pop(0)

    def batch_receive(self) -> List[FakeMsg]:
        got, self.queue = self.queue, []
        return got

    def acknowledge(self, msg: FakeMsg) -> None:
        self.acked.append(msg)
