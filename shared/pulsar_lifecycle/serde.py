"""SerDe classes for function configs (`serdeClassName: pulsar_lifecycle.serde.BytesSerDe`)."""
from __future__ import annotations

from typing import Any


class BytesSerDe:
    """Hands the payload over untouched; the default IdentitySerDe turns b"1e3" into 1000.0."""

    def serialize(self, input: Any) -> bytes:  # noqa: A002 - Pulsar's parameter name
        if isinstance(input, str):
            return input.encode("utf-8")
        return bytes(input)

    def deserialize(self, input_bytes: bytes) -> bytes:
        return bytes(input_bytes)
