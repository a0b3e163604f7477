"""cli_args: the argument checks commands make before they connect."""
from __future__ import annotations

import click
import pytest

from pulsar_lifecycle.cli.args import check_service_url, check_topic, format_ms, parse_duration_ms, parse_time_ms


@pytest.mark.parametrize("text, ms", [("90s", 90_000), ("2h", 7_200_000), ("30d", 2_592_000_000), ("1h30m", 5_400_000),
                                      ("500ms", 500), ("0s", 0), ("1.5s", 1500), ("1w", 604_800_000)])
def test_durations(text, ms):
    assert parse_duration_ms("--in", text) == ms


@pytest.mark.parametrize("text", ["-5s", "", "5", "s", "5x", "1h 30m", "h1"])
def test_bad_durations_name_the_option(text):
    with pytest.raises(click.BadParameter) as err:
        parse_duration_ms("--in", text)
    assert err.value.param_hint == "--in"


def test_times_iso_and_epoch_ms():
    assert parse_time_ms("--at", "1700000000000") == 1_700_000_000_000
    assert parse_time_ms("--at", "2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert parse_time_ms("--at", "2023-11-14T22:13:20") == 1_700_000_000_000  # no zone: UTC
    assert parse_time_ms("--at", "2023-11-14T23:13:20+01:00") == 1_700_000_000_000
    assert format_ms(1_700_000_000_000) == "2023-11-14T22:13:20.000Z"
    for bad in ("-1", "tomorrow", "2023-13-01"):
        with pytest.raises(click.BadParameter):
            parse_time_ms("--at", bad)


def test_topics_and_urls():
    assert check_topic("T", "orders") == "persistent://public/default/orders"
    assert check_topic("T", "a/b/c") == "persistent://a/b/c"
    for bad in ("a/b", "bad tenant!/ns/t", "persistent://a/b/c/d", "persistent://a/b/with space", ""):
        with pytest.raises(click.BadParameter):
            check_topic("T", bad)
    assert check_service_url("U", "pulsar://h:6650") == "pulsar://h:6650"
    for bad in ("h:6650", "http://h:8080", "pulsar://"):
        with pytest.raises(click.BadParameter):
            check_service_url("U", bad)
