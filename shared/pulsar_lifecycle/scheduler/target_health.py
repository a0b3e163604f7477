"""Which release targets the writer holds back, and what it does next with each (pure: no I/O).

A target (a business topic) the writer cannot publish to -- it cannot be opened (authorization
refused, a namespace that does not exist with auto-creation off, a schema the broker enforces) or
a send to it failed -- is *held*: its releases wait in memory, in release order, while every other
target goes on being released. The writer tries the target again after a backoff (0.5 s doubling
to 10 s); a target still failing `retry_ms` after its first failure is *expired* and its held
releases go to the dead-letter topic then (the backoff ends at the limit). New releases to a held target queue behind the held ones,
so per-target order holds.

A target that recovers stays on *probation* until every release re-sent to it is confirmed: a
failure in that time continues the same hold (its first failure and attempts), so a target that
accepts a producer but fails every send still reaches the dead-letter topic in bounded time.

Items are whatever the caller keeps per release; they are kept in the order of `seq_of(item)`.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Tuple

# On a release sent to the dead-letter topic: the target it was released to (full name); the
# reason is in scheduling_protocol.ERROR_PROP.
DEAD_TARGET_PROP = "__pl_dead_target__"
FIRST_BACKOFF_MS = 500
MAX_BACKOFF_MS = 10_000
WAIT, RETRY, DEAD_LETTER = "wait", "retry", "dead_letter"


def backoff_ms(attempts: int, first_ms: int = FIRST_BACKOFF_MS, max_ms: int = MAX_BACKOFF_MS) -> int:
    """The wait after the `attempts`-th failed attempt (1-based): first_ms doubling up to max_ms."""
    if attempts <= 0:
        return 0
    return min(max_ms, first_ms << min(attempts - 1, 30))


@dataclass
class HeldTarget:
    """One held target: its waiting releases (in order) and why it is held."""

    target: str
    items: Deque[Any] = field(default_factory=deque)
    since_ms: Optional[int] = None  # the first failure (None: only waiting for its first open)
    reason: str = ""
    attempts: int = 0
    next_try_ms: int = 0
    busy: bool = False  # an attempt (an open in the background) is under way

    @property
    def failing(self) -> bool:
        return self.since_ms is not None


@dataclass
class _Probation:
    since_ms: int
    attempts: int
    reason: str
    last_seq: int


class TargetHealth:
    """Held targets, their backoff and their time limit."""

    def __init__(self, retry_ms: int, *, first_backoff_ms: int = FIRST_BACKOFF_MS,
                 max_backoff_ms: int = MAX_BACKOFF_MS, seq_of: Callable[[Any], int] = lambda item: item[0]) -> None:
        if retry_ms < 0:
            raise ValueError(f"retry_ms must be >= 0, got {retry_ms!r}")
        self.retry_ms = retry_ms
        self.first_backoff_ms = first_backoff_ms
        self.max_backoff_ms = max_backoff_ms
        self._seq_of = seq_of
        self._held: Dict[str, HeldTarget] = {}
        self._probation: Dict[str, _Probation] = {}

    # -- queries -------------------------------------------------------------------------------
    def __bool__(self) -> bool:
        return bool(self._held)

    def held(self, target: str) -> Optional[HeldTarget]:
        """The target's hold, or None when its releases go out."""
        return self._held.get(target)

    def targets(self) -> List[HeldTarget]:
        """Every held target."""
        return list(self._held.values())

    def held_count(self) -> int:
        """Releases waiting over every held target."""
        return sum(len(h.items) for h in self._held.values())

    def next_action(self, target: str, now_ms: int) -> str:
        """WAIT (an attempt is under way, or its backoff runs), RETRY, or DEAD_LETTER (failing for
        retry_ms or longer: its held releases go to the dead-letter topic)."""
        h = self._held.get(target)
        if h is None or h.busy or now_ms < h.next_try_ms:
            return WAIT
        if h.failing and now_ms - (h.since_ms or 0) >= self.retry_ms:
            return DEAD_LETTER
        return RETRY

    def due(self, now_ms: int) -> List[Tuple[HeldTarget, str]]:
        """(hold, RETRY or DEAD_LETTER) for each held target whose next step is due."""
        out = []
        for h in list(self._held.values()):
            action = self.next_action(h.target, now_ms)
            if action != WAIT:
                out.append((h, action))
        return out

    def next_due_ms(self) -> Optional[int]:
        """When the earliest held target's next step is due (None: nothing waits on time)."""
        times = [h.next_try_ms for h in self._held.values() if not h.busy]
        return min(times) if times else None

    # -- changes -------------------------------------------------------------------------------
    def hold(self, target: str, items: Iterable[Any]) -> HeldTarget:
        """Queue `items` (in order, after any held ones) for `target`, holding it if it was not."""
        h = self._held.get(target)
        if h is None:
            h = self._held[target] = HeldTarget(target)
            p = self._probation.pop(target, None)
            if p is not None:  # a failure while on probation continues that hold
                h.since_ms, h.attempts, h.reason = p.since_ms, p.attempts, p.reason
        h.items.extend(items)
        return h

    def requeue(self, target: str, items: Iterable[Any]) -> HeldTarget:
        """Hold `items` that were sent but not confirmed (a failed send): merged into the held ones
        by sequence id, so the target's order holds."""
        h = self.hold(target, ())
        merged = sorted([*h.items, *items], key=self._seq_of)
        h.items = deque(merged)
        return h

    def failed(self, target: str, reason: str, now_ms: int) -> HeldTarget:
        """An attempt at `target` failed: the first failure starts its time limit; the next
        attempt waits the backoff."""
        h = self.hold(target, ())
        if h.since_ms is None:
            h.since_ms = now_ms
        h.attempts += 1
        h.reason = reason
        h.busy = False
        h.next_try_ms = now_ms + backoff_ms(h.attempts, self.first_backoff_ms, self.max_backoff_ms)
        limit = h.since_ms + self.retry_ms
        if now_ms < limit < h.next_try_ms:
            h.next_try_ms = limit  # the time limit ends the backoff early: dead-lettered at it
        return h

    def attempt(self, target: str) -> None:
        """An attempt at `target` started (its outcome comes later: `failed` or `release`)."""
        h = self._held.get(target)
        if h is not None:
            h.busy = True

    def release(self, target: str) -> List[Any]:
        """The target works again: its held items, in order, to send now. A target that had failed
        stays on probation until `confirmed` passes the last of them."""
        h = self._held.pop(target, None)
        if h is None:
            return []
        items = list(h.items)
        if h.failing and items:
            self._probation[target] = _Probation(h.since_ms or 0, h.attempts, h.reason, self._seq_of(items[-1]))
        return items

    def take(self, target: str) -> List[Any]:
        """The target's held items, in order, removing the hold (they were dead-lettered)."""
        h = self._held.pop(target, None)
        self._probation.pop(target, None)
        return list(h.items) if h is not None else []

    def confirmed(self, upto_seq: int) -> None:
        """Every release up to `upto_seq` is settled: probations that it passes end."""
        if self._probation:
            for target in [t for t, p in self._probation.items() if p.last_seq <= upto_seq]:
                del self._probation[target]

    # -- status --------------------------------------------------------------------------------
    def status(self) -> List[Dict[str, Any]]:
        """Per held target: target, reason, held, since_ms, attempts, next_try_ms (for `inspect writer`)."""
        return [{"target": h.target, "reason": h.reason or "opening", "held": len(h.items), "since_ms": h.since_ms,
                 "attempts": h.attempts, "next_try_ms": h.next_try_ms}
                for h in sorted(self._held.values(), key=lambda h: h.target)]
