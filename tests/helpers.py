"""Bounded helpers for integration tests: consume with deadlines, never loop forever."""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import pulsar


def drain(client: pulsar.Client, topic: str, sub: str, expect: int, timeout: float = 30.0,
          stop: Optional[Callable[[List[pulsar.Message]], bool]] = None) -> List[pulsar.Message]:
    """Receive from `topic` (Shared, Earliest) until `expect` messages or `timeout` seconds."""
    consumer = client.subscribe(topic, sub, consumer_type=pulsar.ConsumerType.Shared,
                                initial_position=pulsar.InitialPosition.Earliest)
    got: List[pulsar.Message] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expect and time.monotonic() < deadline:
            if stop and stop(got):
                break
            try:
                msg = consumer.receive(timeout_millis=200)
            except pulsar.Timeout:
                continue
            got.append(msg)
            consumer.acknowledge(msg)
    finally:
        consumer.close()
    return got


def wait_for(cond: Callable[[], bool], timeout: float = 20.0, interval: float = 0.05) -> bool:
    """Poll `cond` until true or `timeout`; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(interval)
    return cond()


def count_by(messages: List[pulsar.Message], fn: Callable[[pulsar.Message], str]) -> Dict[str, int]:
    """How often each key (fn(message)) occurs."""
    out: Dict[str, int] = {}
    for m in messages:
        k = fn(m)
        out[k] = out.get(k, 0) + 1
    return out
