"""Subscribing on a broker that may still hold a dead process's consumers (pulsar-lite).

pulsar-lite keys a subscription's consumers by the consumer id the client picks, a per-client
counter that starts at 0, and keeps the consumers of a connection that ended with a reset (a
process SIGKILLed with unread data on its socket) registered until the broker restarts. A
restarted process numbers its consumers as its predecessor did, so its subscribe on such a
subscription gets `Consumer N already exists`: the broker closes the whole connection, and the
client subscribes again with the same id until its operation timeout (30 s), after which a new
attempt gets a new id and succeeds (tests/integration/test_broker_quirks.py,
`test_a_reset_connections_consumers_stay_registered`). Apache Pulsar scopes consumer ids per
connection and drops a closed connection's consumers, so none of this happens there.

Two helpers:

* `skip_consumer_ids` makes a client's next consumer ids start at a random offset by
  subscribing (and closing) that many consumers on a non-persistent topic, so a process started
  against a long-lived broker does not reuse its predecessors' ids. `localrun` does it with an
  external broker (0 to 1,023 ids: about 0.2 s on pulsar-lite, under a second on Apache Pulsar on
  a loaded 2-core machine).
* `subscribe_promptly` runs a subscribe and, when it has not answered within `answer_s`, runs
  another beside it (a new consumer, so a new id) instead of waiting out the first one's
  operation timeout. The first attempt that succeeds is used; any that succeeds later is closed
  at once. An unanswered attempt keeps retrying in the background until its own timeout, and on
  pulsar-lite each of its retries closes the client's connection (the client reconnects; a
  producer re-sends what was not yet confirmed). It is the fallback for the rare id that still
  collides after the skip.
"""
from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import pulsar

log = logging.getLogger(__name__)

C = TypeVar("C")

ANSWER_S = 2.0  # a subscribe that has not answered in this long may be refused: start another beside it
MAX_ATTEMPTS = 6  # attempts started in all (each on a new consumer id) before giving up
# A subscribe answered within this long, with no attempt refused, is a slow broker, not a fault: a
# brand-new Apache Pulsar loading a topic on a busy host takes 2-3 s. Its retry and answer log at
# info; a slower answer, or one after a refused attempt, at warning.
SLOW_WARN_S = 10.0
SKIP_RANGE = 1024  # skip_consumer_ids: offsets drawn from [0, SKIP_RANGE)
SKIP_TIMEOUT_S = 10.0


def random_skip() -> int:
    """How many consumer ids a new process skips (uniform over [0, SKIP_RANGE))."""
    return random.randrange(SKIP_RANGE)


def skip_consumer_ids(client: pulsar.Client, count: int, topic: str, apache_pulsar: bool = False) -> int:
    """Advance `client`'s consumer id counter by subscribing `count` consumers on the
    non-persistent `topic` (all at once where the client has an asynchronous subscribe) and
    closing them; returns how many were made. Best effort: a failure is logged, never raised.
    The subscription is the process's own: two processes skipping at once would otherwise clash
    on it with the same ids (pulsar-lite refuses the second and closes its connection).
    Nothing is skipped when the caller knows the broker is `apache_pulsar`
    (runtime.localrun.runs_apache_pulsar): it drops a closed connection's consumers, so the skip
    would only delay the start (0.14-0.21 s of a restart)."""
    if count <= 0:
        return 0
    if apache_pulsar:
        log.info("event=consumer_ids_skip_not_needed topic=%s reason='Apache Pulsar drops a closed connection's "
                 "consumers'", topic)
        return 0
    t0 = time.monotonic()
    subscription = f"consumer-ids-{uuid.uuid4().hex[:12]}"
    native = getattr(client, "_client", None)  # pulsar.Client's native client (its async subscribe)
    try:
        if native is not None and hasattr(native, "subscribe_async"):
            made = _skip_async(native, count, topic, subscription)
        else:
            made = 0
            for _ in range(count):
                client.subscribe(topic, subscription, consumer_type=pulsar.ConsumerType.Shared).close()
                made += 1
    except Exception as exc:  # the skip only lowers the chance of a refused subscribe
        log.warning("event=consumer_ids_skip_failed topic=%s wanted=%d error=%r", topic, count, exc)
        return 0
    log.info("event=consumer_ids_skipped count=%d made=%d seconds=%.2f reason='a broker may still hold a dead "
             "process's consumers under the ids this process would pick first'", count, made, time.monotonic() - t0)
    return made


def _skip_async(native: Any, count: int, topic: str, subscription: str) -> int:
    import _pulsar  # the client's native module: its ConsumerConfiguration for subscribe_async

    conf = _pulsar.ConsumerConfiguration()
    conf.consumer_type(pulsar.ConsumerType.Shared)
    done = threading.Semaphore(0)
    made: List[Any] = []

    def subscribed(result: Any, consumer: Any) -> None:
        if result == _pulsar.Result.Ok:
            made.append(consumer)
        done.release()

    for _ in range(count):
        native.subscribe_async(topic, subscription, conf, subscribed)
    deadline = time.monotonic() + SKIP_TIMEOUT_S
    answered = 0
    while answered < count and done.acquire(timeout=max(0.0, deadline - time.monotonic())):
        answered += 1
    for consumer in list(made):
        consumer.close_async(lambda _result: None)
    return len(made)


class _Race:
    """Subscribe attempts running side by side; the first success wins, later ones are closed."""

    def __init__(self, subscribe: Callable[[], Any], what: str) -> None:
        self._subscribe = subscribe
        self.what = what
        self._lock = threading.Lock()
        self._changed = threading.Event()  # a winner, or every running attempt failed
        self._winner: Optional[Any] = None
        self._abandoned = False
        self._errors: List[BaseException] = []
        self._running = 0

    def start(self, attempt: int) -> None:
        """Run one more attempt on a thread of its own."""
        with self._lock:
            self._running += 1
        threading.Thread(target=self._run, args=(attempt,), name=f"subscribe-{attempt}", daemon=True).start()

    def wait(self, timeout: float) -> Tuple[Optional[Any], int, List[BaseException]]:
        """(winner, attempts still running, errors so far) after up to `timeout` seconds."""
        self._changed.wait(timeout=timeout)
        with self._lock:
            if self._winner is None:
                self._changed.clear()
            return self._winner, self._running, list(self._errors)

    def give_up(self) -> None:
        """The caller stopped waiting: an attempt that succeeds from now on is closed."""
        with self._lock:
            self._abandoned = True

    def _run(self, attempt: int) -> None:
        try:
            consumer = self._subscribe()
        except BaseException as exc:  # reported by the caller when no attempt succeeds
            with self._lock:
                self._running -= 1
                self._errors.append(exc)
                if self._running == 0:
                    self._changed.set()
            return
        with self._lock:
            self._running -= 1
            late = self._winner is not None or self._abandoned
            if not late:
                self._winner = consumer
                self._changed.set()
        if late:
            log.info("event=subscribe_late_attempt_closed what=%s attempt=%d", self.what, attempt)
            try:
                consumer.close()
            except Exception as exc:  # its messages go back to the subscription either way
                log.debug("event=subscribe_late_close_failed what=%s error=%r", self.what, exc)


def subscribe_promptly(subscribe: Callable[[], C], what: str, answer_s: float = ANSWER_S,
                       max_attempts: int = MAX_ATTEMPTS, deadline_s: float = 60.0) -> C:
    """`subscribe()` (a `client.subscribe(...)` call), with another attempt started beside any
    that has not answered within `answer_s` and after any that failed, at most `max_attempts` in
    all; the first to succeed is returned (see the module docstring). Raises the last error when
    every attempt failed, TimeoutError when none answered within `deadline_s`."""
    race = _Race(subscribe, what)
    started = 1
    race.start(started)
    t0 = time.monotonic()
    try:
        while True:
            winner, running, errors = race.wait(answer_s)
            if winner is not None:
                if started > 1:
                    took = time.monotonic() - t0
                    log.log(logging.WARNING if errors or took >= SLOW_WARN_S else logging.INFO,
                            "event=subscribe_answered what=%s attempts=%d seconds=%.1f refused=%d reason='an earlier "
                            "attempt did not answer or failed'", what, started, took, len(errors))
                return winner  # type: ignore[no-any-return]
            if time.monotonic() - t0 >= deadline_s:
                raise TimeoutError(f"subscribing {what}: no attempt answered within {deadline_s:.0f} s")
            if started >= max_attempts:
                if running == 0:
                    raise errors[-1] if errors else TimeoutError(f"subscribing {what}: no attempt answered")
                continue
            failed_now = running == 0 and bool(errors)
            started += 1
            log.log(logging.WARNING if errors else logging.INFO,
                    "event=subscribe_retry what=%s attempt=%d reason=%s", what, started,
                    f"'the previous attempt failed: {errors[-1]!r}'" if failed_now
                    else f"'no answer within {answer_s:.1f} s: a slow broker, or one that still holds a dead "
                         "process's consumer under this id; a new attempt gets a new id'")
            if failed_now:
                time.sleep(min(2.0, 0.25 * started))  # a failure that came at once: do not spin
            race.start(started)
    except BaseException:
        race.give_up()
        raise
