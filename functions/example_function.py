"""ExampleFunction: the smallest useful function — exclaims its input and counts it in state.

Used by the README's main command and the runtime tests until the real functions joined.
"""
from __future__ import annotations

from typing import Any, Optional

from pulsar_lifecycle.config.example import ExampleConfig


class ExampleFunction:
    """Returns `<input>!` (or `<prefix><input>!` with userConfig `prefix`) and counts messages
    in state key `processed` unless userConfig `countProcessed` is false."""

    def __init__(self) -> None:
        # Kept trivial: Pulsar's runtime silently changes mode if __init__ raises.
        self.config: Optional[ExampleConfig] = None

    def process(self, input: Any, context: Any) -> str:  # noqa: A002 - Pulsar's parameter name
        if self.config is None:
            self.config = ExampleConfig.from_user_config(context.get_user_config_map())
        if self.config.count_processed:
            context.incr_counter("processed", 1)
        return f"{self.config.prefix}{input}!"
