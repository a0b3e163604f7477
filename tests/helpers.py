"""Bounded helpers for integration tests: consume with deadlines, never loop forever."""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import pulsar

from pulsar_lifecycle.runtime.client import receive_messages


def drain(client: pulsar.Client, topic: str, sub: str, expect: int, timeout: float = 30.0,
          stop: Optional[Callable[[List[pulsar.Message]], bool]] = None) -> List[pulsar.Message]:
    """Receive from `topic` (Shared, Earliest) until `expect` messages or `timeout` seconds."""
    return receive_messages(client, topic, sub, expect, timeout, stop)


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


def publish_all(prod: pulsar.Producer, payloads: list, properties: Optional[List[Dict[str, str]]] = None,
                rounds: int = 5) -> None:
    """Send every payload, re-sending those whose send failed.

    pulsar-lite occasionally fails a batch while a topic is being created; a test's own inputs
    must all exist before it can count what the function did with them.
    """
    todo = list(range(len(payloads)))
    for _ in range(rounds):
        failed: List[int] = []
        for i in todo:
            props = properties[i] if properties else None
            prod.send_async(payloads[i], lambda res, _mid, i=i: res == pulsar.Result.Ok or failed.append(i),
                            properties=props)
        prod.flush()
        if not failed:
            return
        todo = failed
    raise AssertionError(f"{len(todo)} inputs could not be published")
