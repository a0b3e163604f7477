"""Bounded helpers for integration tests: consume with deadlines, never loop forever."""
from __future__ import annotations

import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional

import pulsar

from pulsar_lifecycle.runtime.client import receive_messages
from support.paths import REPO


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


def wait_value(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.5) -> Any:
    """Poll `check` until it returns something true and return that; AssertionError naming `what`
    after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(interval_s)


def count_by(messages: List[pulsar.Message], fn: Callable[[pulsar.Message], str]) -> Dict[str, int]:
    """How often each key (fn(message)) occurs."""
    out: Dict[str, int] = {}
    for m in messages:
        k = fn(m)
        out[k] = out.get(k, 0) + 1
    return out


def publish_all(prod: pulsar.Producer, payloads: list, properties: Optional[List[Dict[str, str]]] = None,
                rounds: int = 5, window: int = 500) -> None:
    """Send every payload, re-sending those whose send failed.

    pulsar-lite occasionally fails a batch while a topic is being created; a test's own inputs
    must all exist before it can count what the function did with them. Sends go out `window` at a
    time, each window flushed before the next: a producer's queue (1,000 messages by default, and
    `block_if_queue_full` off) would otherwise refuse everything past it at once on a slow broker,
    and a few rounds would not get the rest through.
    """
    todo = list(range(len(payloads)))
    refusals: Dict[str, int] = {}

    def sent(res: pulsar.Result, i: int, failed: List[int]) -> None:
        if res != pulsar.Result.Ok:
            failed.append(i)
            refusals[str(res)] = refusals.get(str(res), 0) + 1

    for _ in range(rounds):
        failed: List[int] = []
        for start in range(0, len(todo), window):
            for i in todo[start:start + window]:
                props = properties[i] if properties else None
                prod.send_async(payloads[i], lambda res, _mid, i=i, failed=failed: sent(res, i, failed),
                                properties=props)
            prod.flush()
        if not failed:
            return
        todo = failed
    raise AssertionError(f"{len(todo)} inputs could not be published (refusals by result: {refusals})")


def shipped_writer_spec(unique: str, prefix: str, **user):
    """(FunctionSpec, scheduling topic) of the shipped BucketSnapshotWriter config with this
    test's topics (direct intake, tick topic the only input, runner ticks every 200 ms) and `user` merged
    into its userConfig. Without `snapshotDir` the index lives in the local runner's --data-dir."""

    from pulsar_lifecycle.config.function_config import load_function_config, spec_from_config

    cfg = load_function_config(REPO / "function-configs" / "bucket-snapshot-writer.yaml")
    sched = f"persistent://public/default/{prefix}sched-{unique}"
    ticks = f"persistent://public/default/{prefix}ticks-{unique}"
    cfg["inputSpecs"] = {ticks: {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}}
    cfg["output"] = f"persistent://public/default/{prefix}released-{unique}"
    cfg["name"] = f"{prefix}writer-{unique}"
    # tickMode runner: the local runner's ticks start it (the tick topic is the only input here).
    user = {"tickMode": "runner", **user}
    cfg["userConfig"] = dict(cfg["userConfig"], tickTopic=ticks, tickTimeMillis=200, schedulingTopic=sched, **user)
    return spec_from_config(cfg), sched


def receive_until(consumer: pulsar.Consumer, timeout: float,
                  until: Callable[[List[pulsar.Message]], bool]) -> List[pulsar.Message]:
    """Messages from an open consumer, each acked, until `until(received so far)` holds or `timeout`
    seconds pass (whichever first); `until` is asked after every receive attempt, so a condition on
    the clock ends the wait even when nothing arrives."""
    got: List[pulsar.Message] = []
    deadline = time.monotonic() + timeout
    while not until(got) and time.monotonic() < deadline:
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        consumer.acknowledge(m)
        got.append(m)
    return got


def receive_payloads(consumer: pulsar.Consumer, want: int, timeout: float) -> List[str]:
    """Payloads (decoded) from an open consumer, acked, until `want` or `timeout` seconds."""
    return [m.data().decode() for m in receive_until(consumer, timeout, lambda got: len(got) >= want)]


def stop_process(proc: "subprocess.Popen[bytes]", sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
    """Stop a function process the way an operator would (SIGINT by default) and return its exit
    code; one still running after ``timeout`` seconds is SIGKILLed. A process already gone is left alone."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(timeout=10)
