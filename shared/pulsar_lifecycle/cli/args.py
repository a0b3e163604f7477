"""Argument checks every command makes before it connects to anything.

A typo in a topic or URL, a negative id or an impossible delay is refused at once with one
line naming the option, instead of after a connection timeout.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, Tuple

import click

from ..config.function_config import FunctionConfigError, FunctionSpec, load_function_config, spec_from_config
from ..runtime.broker import DEFAULT_CONNECT_TIMEOUT_S, broker_hosts
from ..topics import TopicName, TopicNameError, is_named_entity

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def check_topic(option: str, topic: str) -> str:
    """The fully qualified name of `topic` (`persistent://tenant/ns/name`, `tenant/ns/name` or a
    bare name in public/default), or click.BadParameter naming `option` and what is wrong."""
    try:
        name = TopicName.from_client(topic)
    except TopicNameError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    for label, value in (("tenant", name.tenant), ("namespace", name.namespace)):
        if not is_named_entity(value):
            raise click.BadParameter(f"topic {topic!r} has an invalid {label} {value!r} "
                                     "(allowed: letters, digits, - _ = : .)", param_hint=option)
    if "/" in name.local_name or any(c.isspace() or ord(c) < 32 for c in name.local_name):
        raise click.BadParameter(f"topic {topic!r} has an illegal topic name {name.local_name!r} "
                                 "(no '/', whitespace or control characters)", param_hint=option)
    return name.full_name


def connect_timeout_option(f: Any) -> Any:
    """`--connect-timeout SECONDS`, passed as None when not given (runtime.connect.open_client:
    the default wait, and a refused connection fails at once; given, refused connections are
    waited through up to it)."""
    return click.option(
        "--connect-timeout", type=click.FloatRange(min=0.5), default=None,
        help=f"Seconds to wait for the broker to accept connections and answer, refused connections included "
             f"(a broker still starting). Not given: {DEFAULT_CONNECT_TIMEOUT_S:g} s for one that does not answer "
             "yet, and a refused connection (nothing listens there) fails at once.")(f)


def check_service_url(option: str, url: str) -> str:
    """`url` when it is a pulsar:// or pulsar+ssl:// URL with a host, else click.BadParameter."""
    if not url.startswith(("pulsar://", "pulsar+ssl://")) or not broker_hosts(url):
        raise click.BadParameter(f"{url!r} is not a broker service URL (pulsar://host:port)", param_hint=option)
    return url


def check_http_url(option: str, url: Optional[str]) -> Optional[str]:
    """`url` when it is None or an http(s):// URL with a host, else click.BadParameter."""
    if url is None:
        return None
    if not re.match(r"^https?://[^/\s]+", url):
        raise click.BadParameter(f"{url!r} is not an http(s):// URL", param_hint=option)
    return url.rstrip("/")


def parse_duration_ms(option: str, text: str) -> int:
    """`90s`, `2h`, `30d`, `1h30m`, `500ms` (units ms s m h d w) as milliseconds; click.BadParameter
    for anything else, a negative duration included."""
    raw = text.strip().lower()
    if raw.startswith("-"):
        raise click.BadParameter(f"{text!r} is negative: a delay must not be in the past", param_hint=option)
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(raw):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_MS[m.group(2)]
        pos = m.end()
    if pos != len(raw) or not raw:
        raise click.BadParameter(f"{text!r} is not a duration such as 90s, 2h, 30d or 1h30m "
                                 "(units: ms, s, m, h, d, w)", param_hint=option)
    return int(round(total))


def parse_time_ms(option: str, text: str) -> int:
    """An epoch time in ms (digits) or an ISO 8601 time (a time without a zone is UTC) as epoch ms."""
    raw = text.strip()
    if raw.lstrip("-").isdigit():
        value = int(raw)
        if value < 0:
            raise click.BadParameter(f"{text!r} is negative", param_hint=option)
        return value
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither epoch milliseconds nor an ISO 8601 time "
                                 "(e.g. 2030-01-31T12:00:00Z)", param_hint=option) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(round(when.timestamp() * 1000))


def format_ms(epoch_ms: Optional[int]) -> str:
    """An epoch time in ms as an ISO 8601 UTC time with milliseconds ("-" for None)."""
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def function_config_option(given: Optional[str], shipped: str, option: str) -> Optional[Tuple[str, FunctionSpec]]:
    """(path, spec) of the function config an option names, else of the shipped config `shipped`
    when it is here (the command runs from a checkout or an unpacked release), else None.

    A named file that is missing or is not a function config is refused with one line naming
    the option; which function it configures is the caller's check."""
    path = given or (shipped if Path(shipped).is_file() else None)
    if path is None:
        return None
    if not Path(path).is_file():
        raise click.BadParameter(f"{path} not found", param_hint=option)
    try:
        return path, spec_from_config(load_function_config(path))
    except FunctionConfigError as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint=option) from exc
