"""The userConfig keys each shipped function understands (used by `validate`)."""
from __future__ import annotations

from typing import Collection, Dict

USER_CONFIG_KEYS: Dict[str, Collection[str]] = {
    "example_function.ExampleFunction": ("prefix",),
}
