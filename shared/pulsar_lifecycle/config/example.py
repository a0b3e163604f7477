"""userConfig of ExampleFunction (functions/example_function.py), declared as the others are."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .settings import check_settings, parse_settings, setting

__all__ = ["ExampleConfig"]


@dataclass(frozen=True)
class ExampleConfig:
    """ExampleFunction settings: one field per userConfig key."""

    prefix: str = setting("prefix", "", "Text put before each exclaimed input.")
    count_processed: bool = setting(
        "countProcessed", True,
        "Count processed messages in state key `processed` (one durable state write per message).")

    def __post_init__(self) -> None:
        check_settings(self)

    @classmethod
    def from_user_config(cls, user_config: Optional[Mapping[str, Any]]) -> "ExampleConfig":
        """userConfig -> ExampleConfig; an unknown key or a wrong value is a ConfigError naming it."""
        return parse_settings(cls, user_config, function="ExampleFunction")
