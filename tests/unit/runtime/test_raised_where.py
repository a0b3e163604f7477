"""`raised_where` names the code that raised a function's exception, past the client's wrapper."""
from __future__ import annotations

import pulsar
import pytest

from pulsar_lifecycle.runtime.instance import raised_where


def _inner() -> None:
    raise ValueError("bad input")


def _outer() -> None:
    _inner()


def test_names_the_two_innermost_frames_innermost_first() -> None:
    with pytest.raises(ValueError) as info:
        _outer()
    assert raised_where(info.value) == (f"test_raised_where.py:{_inner.__code__.co_firstlineno + 1}:_inner"
                                        f"<-test_raised_where.py:{_outer.__code__.co_firstlineno + 1}:_outer")


def test_skips_the_pulsar_clients_wrapper_frames() -> None:
    client = pulsar.Client("pulsar://127.0.0.1:1", operation_timeout_seconds=1, connection_timeout_ms=200)
    try:
        with pytest.raises(pulsar.PulsarException) as info:
            client.create_producer("persistent://public/default/nowhere")
    finally:
        client.close()
    where = raised_where(info.value)
    assert where.startswith("test_raised_where.py:") and "__init__.py" not in where, where
