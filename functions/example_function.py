"""ExampleFunction: the smallest useful function — exclaims its input and counts it in state.

Used by the README's main command and the runtime tests until the real functions joined.
"""
from __future__ import annotations

from typing import Any


class ExampleFunction:
    """Returns `<input>!` (or `<prefix><input>!` with userConfig `prefix`) and counts messages
    in state key `processed` unless userConfig `countProcessed` is false."""

    def process(self, input: Any, context: Any) -> str:  # noqa: A002 - Pulsar's parameter name
        prefix = context.get_user_config_value("prefix") or ""
        if context.get_user_config_value("countProcessed") is not False:
            context.incr_counter("processed", 1)
        return f"{prefix}{input}!"
