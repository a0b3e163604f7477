"""A StateStore over the function Context, so library code can keep state the Pulsar way.

Pulsar's Context stores str values (the runtime UTF-8-encodes them), so bytes are kept as
base64 text.
"""
from __future__ import annotations

import base64
from typing import Any, Optional


class ContextStateStore:
    """StateStore backed by context.put_state/get_state/incr_counter."""

    def __init__(self, context: Any, prefix: str = "") -> None:
        self._ctx = context
        self._prefix = prefix

    def put(self, key: str, value: bytes) -> None:
        self._ctx.put_state(self._prefix + key, base64.b64encode(bytes(value)).decode("ascii"))

    def get(self, key: str) -> Optional[bytes]:
        raw = self._ctx.get_state(self._prefix + key)
        if raw is None:
            return None
        return base64.b64decode(raw)

    def incr(self, key: str, amount: int) -> None:
        self._ctx.incr_counter(self._prefix + key, amount)

    def get_counter(self, key: str) -> Optional[int]:
        return self._ctx.get_counter(self._prefix + key)

    def delete(self, key: str) -> None:
        self._ctx.del_counter(self._prefix + key)

    def close(self) -> None:
        pass
