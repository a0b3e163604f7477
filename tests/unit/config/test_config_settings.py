"""One converter set for every function's userConfig: the same value gets the same answer (or the
same kind of error, naming the key and the value) from every config class and every key."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Tuple

import pytest

from pulsar_lifecycle.bucket.config import BucketConfig
from pulsar_lifecycle.cli.function_registry import FUNCTIONS
from pulsar_lifecycle.config.example import ExampleConfig
from pulsar_lifecycle.config.settings import ConfigError, settings_of, to_bool, to_int, to_str, to_str_list
from pulsar_lifecycle.delaylevel.config import SyncerConfig
from pulsar_lifecycle.deletion.config import DeletionConfig
from pulsar_lifecycle.scheduler.config import WriterConfig

REFUSED = object()

#: The table from issue 9: every integer key answers these the same way.
INTEGER_CASES: List[Tuple[Any, Any]] = [
    (5, 5), ("5", 5), (5.0, 5), ("5.0", 5), (" 5 ", 5),
    (5.7, REFUSED), ("5.7", REFUSED), ("x", REFUSED), ("", REFUSED), (True, REFUSED), ("true", REFUSED),
    ([5], REFUSED),
]
BOOLEAN_CASES: List[Tuple[Any, Any]] = [
    (True, True), ("true", True), ("TRUE", True), (False, False), ("false", False), ("False", False),
    (1, REFUSED), (0, REFUSED), ("yes", REFUSED), (5.7, REFUSED), ("x", REFUSED),
]
STRING_REFUSED: List[Any] = [5, 5.0, 5.7, True, [1]]

# How each function builds its config from userConfig (with the keys it cannot start without).
BUILDERS: Dict[type, Callable[[Dict[str, Any]], Any]] = {
    ExampleConfig: ExampleConfig.from_user_config,
    WriterConfig: WriterConfig.from_user_config,
    BucketConfig: lambda user: WriterConfig.from_user_config(user).bucket,  # the writer reads these keys
    DeletionConfig: lambda user: DeletionConfig.from_user_config({"delayBackend": "broker", **user}),
    SyncerConfig: lambda user: SyncerConfig.from_user_config({"delayLevelTopic": "dl", "schedulingTopic": "s", **user}),
}

# Keys whose valid values depend on another key's (a unit length only goes with partitionBy SECONDS).
COMPANIONS: Dict[str, Dict[str, Any]] = {"unitSeconds": {"partitionBy": "SECONDS", "messageMaximumDelayTimeSeconds": 3600}}


def _keys(kind: Callable[..., Any]) -> List[Tuple[type, str, str, Any]]:
    """(config class, key, attribute, a valid value) of every setting read by `kind`."""
    out = []
    for cls in BUILDERS:
        for key, (f, spec) in settings_of(cls).items():
            if spec.convert is kind:
                out.append((cls, key, f.name, f.default))
    return out


def _answer(cls: type, key: str, attr: str, value: Any) -> Any:
    try:
        return getattr(BUILDERS[cls]({**COMPANIONS.get(key, {}), key: value}), attr)
    except ConfigError as exc:
        assert key in str(exc) and repr(value) in str(exc), f"{cls.__name__}: {exc}"
        return REFUSED


def test_every_function_config_class_is_covered():
    assert {cls for entry in FUNCTIONS for cls in entry.configs} == set(BUILDERS)
    assert len(_keys(to_int)) >= 30 and _keys(to_bool) and _keys(to_str)


@pytest.mark.parametrize("cls,key,attr,default", _keys(to_int), ids=lambda v: v if isinstance(v, str) else "")
def test_integer_keys_give_one_answer(cls, key, attr, default):
    # Scale the table to a value this key accepts (5 is below some bounds, e.g. a strategy's maximum).
    good = default if isinstance(default, int) and default >= 5 else 5
    answers = []
    for value, expected in INTEGER_CASES:
        if isinstance(value, (int, float, str)) and not isinstance(value, bool) and expected is not REFUSED:
            value = type(value)(str(value).replace("5", str(good), 1)) if isinstance(value, str) else type(value)(good)
            expected = good
        answers.append((value, _answer(cls, key, attr, value), expected))
    assert [(v, a) for v, a, _ in answers] == [(v, e) for v, _, e in answers]


@pytest.mark.parametrize("cls,key,attr,default", _keys(to_bool), ids=lambda v: v if isinstance(v, str) else "")
def test_boolean_keys_give_one_answer(cls, key, attr, default):
    assert [_answer(cls, key, attr, v) for v, _ in BOOLEAN_CASES] == [e for _, e in BOOLEAN_CASES]


@pytest.mark.parametrize("cls,key,attr,default", _keys(to_str), ids=lambda v: v if isinstance(v, str) else "")
def test_string_keys_refuse_non_strings(cls, key, attr, default):
    assert [_answer(cls, key, attr, v) for v in STRING_REFUSED] == [REFUSED] * len(STRING_REFUSED)


def test_the_table_itself():
    # The converters directly: the rule docs/configuration.md states.
    for value, expected in INTEGER_CASES:
        if expected is REFUSED:
            with pytest.raises(ConfigError, match=r"userConfig k must be an integer, got "):
                to_int("k", value)
        else:
            assert to_int("k", value) == expected
    assert to_str_list("k", "a, b,,c") == ("a", "b", "c") == to_str_list("k", ["a", " b", "c"])
    with pytest.raises(ConfigError, match="userConfig k must be a string or a list of strings, got 5"):
        to_str_list("k", 5)
    assert to_str("k", "") == ""


def test_none_means_not_given():
    assert WriterConfig.from_user_config({"tickTimeMillis": None}).tick_time_millis == 1000
    assert ExampleConfig.from_user_config({"countProcessed": None}).count_processed is True


@pytest.mark.parametrize("cls", list(BUILDERS), ids=lambda c: c.__name__)
def test_unknown_key_is_an_error_naming_it(cls):
    with pytest.raises(ConfigError, match=r"unknown userConfig key 'tickTimeMilis' for \w+ \(did you mean"
                                          if cls in (WriterConfig, BucketConfig, SyncerConfig)
                                          else r"unknown userConfig key 'tickTimeMilis' for \w+"):
        BUILDERS[cls]({"tickTimeMilis": 5})


def test_bounds_name_the_key_in_code_and_in_user_config():
    with pytest.raises(ConfigError, match=r"userConfig tickTimeMillis must be >= 1, got 0"):
        WriterConfig.from_user_config({"tickTimeMillis": "0"})
    with pytest.raises(ConfigError, match=r"userConfig tickTimeMillis must be >= 1, got 0"):
        WriterConfig(tick_time_millis=0)
    with pytest.raises(ConfigError, match=r"userConfig tickMode must be one of 'hold', 'runner', 'chain', got 'x'"):
        SyncerConfig.from_user_config({"delayLevelTopic": "dl", "schedulingTopic": "s", "tickMode": "x"})
    assert BucketConfig(delayed_delivery_max_num_buckets=-1).delayed_delivery_max_num_buckets == -1


def test_config_classes_are_frozen_and_fields_carry_key_default_and_meaning():
    for cls in BUILDERS:
        assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]
        for key, (f, spec) in settings_of(cls).items():
            assert spec.key == key and spec.meaning.strip(), (cls, key)
            assert f.default is not dataclasses.MISSING, (cls, key)


def test_validate_reports_values_with_the_same_converters():
    # `pulsar-lifecycle validate` builds each function's config as the function does.
    checks = {entry.class_name: entry.check for entry in FUNCTIONS}
    base = {"userConfig": {"tickTimeMillis": 5.7}}
    assert checks["bucket_snapshot_writer.BucketSnapshotWriter"](base)[0] == \
        "userConfig tickTimeMillis must be an integer, got 5.7"
    assert checks["delay_level_syncer.DelayLevelSyncer"](
        {"userConfig": {"delayLevelTopic": "dl", "schedulingTopic": "s", "tickTimeMillis": 5.7}}) == \
        ["userConfig tickTimeMillis must be an integer, got 5.7"]
    assert checks["ledger_deletion_worker.LedgerDeletionWorker"](
        {"userConfig": {"delayBackend": "broker", "maxRedeliverCount": "5.7"}}) == \
        ["userConfig maxRedeliverCount must be an integer, got '5.7'"]
    assert checks["example_function.ExampleFunction"]({"userConfig": {"countProcessed": "maybe"}}) == \
        ["userConfig countProcessed must be true or false, got 'maybe'"]
    assert checks["example_function.ExampleFunction"]({"userConfig": {"countProcessed": "FALSE"}}) == []


def test_user_config_json_is_read_once():
    # `--user-config` of localrun, the Spark jobs and the local Context: one reader.
    from pulsar_lifecycle.config.settings import user_config_from_json

    assert user_config_from_json('{"tickTimeMillis": 5.0}') == {"tickTimeMillis": 5.0}
    with pytest.raises(ConfigError, match="--user-config must be a JSON object, got list"):
        user_config_from_json("[1]")
    with pytest.raises(ConfigError, match="--user-config is not valid JSON"):
        user_config_from_json("{x")
