"""Function config validation: shipped configs pass, each pulsar-admin rule is reported clearly."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from pulsar_lifecycle.config.function_config import (
    CONSUMER_CONFIG_FIELDS,
    FUNCTION_CONFIG_FIELDS,
    FunctionConfigError,
    load_function_config,
)
from pulsar_lifecycle.config.validate import topic_problem, validate_config, validate_files
from support.paths import REPO

SHIPPED = sorted((REPO / "function-configs").glob("*.yaml"))


def _user_config_keys() -> Any:
    try:
        from pulsar_lifecycle.cli.function_registry import USER_CONFIG_KEYS
    except ImportError:
        return None
    return USER_CONFIG_KEYS


def _base() -> Dict[str, Any]:
    return {
        "tenant": "public",
        "namespace": "default",
        "name": "fn",
        "className": "example_function.ExampleFunction",
        "inputs": ["persistent://public/default/in"],
        "output": "persistent://public/default/out",
        "processingGuarantees": "ATLEAST_ONCE",
    }


def _write(tmp_path: Path, cfg: Any, name: str = "fn.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _only(problems: List[str], needle: str) -> str:
    hits = [p for p in problems if needle in p]
    assert len(hits) == 1, problems
    return hits[0]


def test_there_are_shipped_configs() -> None:
    assert SHIPPED, "function-configs/*.yaml is empty"


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_config_is_valid(path: Path) -> None:
    assert validate_files([path], _user_config_keys()) == []


def test_shipped_directory_is_valid() -> None:
    from pulsar_lifecycle.cli.function_registry import FUNCTION_CHECKS

    assert validate_files([REPO / "function-configs"], _user_config_keys(), FUNCTION_CHECKS) == []


def test_writer_values_and_inputs_are_checked(tmp_path: Path) -> None:
    """The writer's own checks: its userConfig values, direct intake's inputs (tick topic and the
    scheduling topic only) and one subscription for the scheduling topic's two consumers."""
    from pulsar_lifecycle.cli.function_registry import FUNCTION_CHECKS

    cfg = yaml.safe_load((REPO / "function-configs" / "bucket-snapshot-writer.yaml").read_text())
    cfg["inputSpecs"]["persistent://public/default/other"] = {"serdeClassName": "pulsar_lifecycle.serde.BytesSerDe"}
    cfg["userConfig"]["tickMode"] = "sometimes"
    cfg["subName"] = "elsewhere"
    path = _write(tmp_path, cfg)
    problems = validate_files([path], _user_config_keys(), FUNCTION_CHECKS)
    assert "tickMode must be one of 'hold', 'runner', 'chain'" in _only(problems, "tickMode")
    assert str(path) in _only(problems, "remove them from inputs")
    assert "'elsewhere'" in _only(problems, "schedulingSubscription")
    del cfg["inputSpecs"]["persistent://public/default/other"]
    cfg["userConfig"]["schedulingSubscription"] = "elsewhere"
    cfg["userConfig"]["tickMode"] = "chain"
    assert validate_files([_write(tmp_path, cfg)], _user_config_keys(), FUNCTION_CHECKS) == []
    del cfg["userConfig"]["schedulingTopic"]  # runtime intake: the scheduling topic is the one other input
    del cfg["userConfig"]["schedulingSubscription"]
    assert validate_files([_write(tmp_path, cfg)], _user_config_keys(), FUNCTION_CHECKS) == []


def test_base_config_is_valid() -> None:
    assert validate_config(_base(), "fn.yaml") == []


def test_max_message_retries_rejected_with_pulsar_message(tmp_path: Path) -> None:
    cfg = _base() | {"maxMessageRetries": 3}
    path = _write(tmp_path, cfg)
    line = _only(validate_files([path]), "maxMessageRetries")
    assert line.startswith(str(path))
    assert "Message retries not yet supported in python" in line


def test_negative_max_message_retries_means_infinite_and_passes() -> None:
    assert validate_config(_base() | {"maxMessageRetries": -1}, "f.yaml") == []


def test_dead_letter_topic_rejected() -> None:
    cfg = _base() | {"deadLetterTopic": "persistent://public/default/dlq"}
    assert "Dead Letter Topic specified" in _only(validate_config(cfg, "f.yaml"), "deadLetterTopic")


def test_misspelled_key_names_it_and_lists_valid_fields(tmp_path: Path) -> None:
    cfg = _base() | {"procesingGuarantees": "ATLEAST_ONCE"}
    path = _write(tmp_path, cfg)
    line = _only(validate_files([path]), "procesingGuarantees")
    assert line.startswith(f"{path}:")  # with the line number from the YAML
    assert "Invalid field 'procesingGuarantees'" in line
    assert "did you mean 'processingGuarantees'" in line
    assert "Valid fields are [" in line
    for valid in FUNCTION_CONFIG_FIELDS:
        assert valid in line


def test_unknown_nested_key(tmp_path: Path) -> None:
    cfg = _base()
    cfg["inputSpecs"] = {"persistent://public/default/in2": {"receiverQueueSize": 5, "schemaTyp": "string"}}
    cfg["producerConfig"] = {"batchingConfig": {"enabled": True, "maxDelay": 5}}
    problems = validate_files([_write(tmp_path, cfg)])
    consumer = _only(problems, "'schemaTyp'")
    assert "inputSpecs['persistent://public/default/in2']" in consumer
    for valid in CONSUMER_CONFIG_FIELDS:
        assert valid in consumer
    batching = _only(problems, "'maxDelay'")
    assert "producerConfig.batchingConfig" in batching and "batchingMaxPublishDelayMs" in batching
    assert len(problems) == 2, problems


def test_timeout_below_10s_rejected() -> None:
    line = _only(validate_config(_base() | {"timeoutMs": 5000}, "f.yaml"), "timeoutMs")
    assert "5000" in line and "10000" in line
    assert validate_config(_base() | {"timeoutMs": 10000}, "f.yaml") == []


def test_timeout_needs_atleast_once() -> None:
    cfg = _base() | {"timeoutMs": 30000, "processingGuarantees": "ATMOST_ONCE"}
    assert "ATLEAST_ONCE" in _only(validate_config(cfg, "f.yaml"), "timeoutMs")


@pytest.mark.parametrize("key", ["inputs", "output", "logTopic"])
def test_non_qualified_topic_rejected(key: str) -> None:
    cfg = _base()
    cfg[key] = ["my-topic"] if key == "inputs" else "my-topic"
    line = _only(validate_config(cfg, "f.yaml"), "'my-topic'")
    assert line.startswith("f.yaml") and "fully qualified" in line


def test_topic_format_details() -> None:
    assert topic_problem("persistent://public/default/t") is None
    assert topic_problem("non-persistent://public/default/t-partition-3") is None
    assert "exactly tenant/namespace/topic" in (topic_problem("persistent://public/default") or "")
    assert "exactly tenant/namespace/topic" in (topic_problem("persistent://a/b/c/d") or "")
    assert "invalid tenant" in (topic_problem("persistent://pub lic/default/t") or "")
    assert "empty topic name" in (topic_problem("persistent://public/default/") or "")
    assert "fully qualified" in (topic_problem("public/default/t") or "")


def test_input_spec_and_serde_keys_must_be_qualified() -> None:
    cfg = _base()
    cfg["inputSpecs"] = {"short": {"schemaType": "string"}}
    cfg["customSerdeInputs"] = {"other": "serde.PickleSerDe"}
    problems = validate_config(cfg, "f.yaml")
    _only(problems, "'short'")
    _only(problems, "'other'")


def test_user_config_topic_values_checked_only_when_qualified() -> None:
    cfg = _base() | {"userConfig": {"retryTopic": "persistent://public/x", "deadTopic": "short-is-fine",
                                    "outputTopics": ["persistent://public/default/a", "persistent://bad"],
                                    "topicCount": 3}}
    problems = validate_config(cfg, "f.yaml")
    _only(problems, "retryTopic")
    _only(problems, "persistent://bad")
    assert len(problems) == 2, problems


def test_effectively_once_rejected() -> None:
    line = _only(validate_config(_base() | {"processingGuarantees": "EFFECTIVELY_ONCE"}, "f.yaml"),
                 "EFFECTIVELY_ONCE")
    assert "Effectively-once processing guarantees not yet supported in Python" in line


def test_window_config_rejected() -> None:
    line = _only(validate_config(_base() | {"windowConfig": {"windowLengthCount": 10}}, "f.yaml"), "window")
    assert "no support windowing in python" in line


def test_class_name_required() -> None:
    cfg = _base()
    del cfg["className"]
    assert "className is required" in _only(validate_config(cfg, "f.yaml"), "className")


def test_enum_values() -> None:
    cfg = _base() | {"processingGuarantees": "atleast_once", "subscriptionPosition": "earliest",
                     "producerConfig": {"compressionType": "GZIP"}}
    problems = validate_config(cfg, "f.yaml")
    assert "did you mean 'ATLEAST_ONCE'" in _only(problems, "processingGuarantees")
    assert "did you mean 'Earliest'" in _only(problems, "subscriptionPosition")
    assert "LZ4" in _only(problems, "compressionType")


def test_schema_types() -> None:
    cfg = _base()
    cfg["inputSpecs"] = {"persistent://public/default/s": {"schemaType": "STRING"},
                         "persistent://public/default/j": {"schemaType": "json"},
                         "persistent://public/default/c": {"schemaType": "my_schemas.Custom"},
                         "persistent://public/default/b": {"schemaType": "protobuf"}}
    cfg["outputSchemaType"] = "avro"
    problems = validate_config(cfg, "f.yaml")
    assert "inputTypeClassName" in _only(problems, "/j']")
    assert "'protobuf'" in _only(problems, "/b']")
    assert "outputTypeClassName" in _only(problems, "outputSchemaType")
    assert len(problems) == 3, problems


def test_types() -> None:
    cfg = _base() | {"parallelism": "2", "autoAck": "yes", "inputs": "persistent://public/default/in",
                     "userConfig": ["a"], "resources": {"cpu": "1"}}
    problems = validate_config(cfg, "f.yaml")
    assert "must be an integer" in _only(problems, "parallelism")
    assert "must be a boolean" in _only(problems, "autoAck")
    assert "must be a list of strings" in _only(problems, "inputs must")
    assert "must be a mapping" in _only(problems, "userConfig")
    assert "must be a number" in _only(problems, "resources.cpu")


def test_no_inputs_and_output_equal_input() -> None:
    cfg = _base()
    del cfg["inputs"]
    assert validate_config(cfg, "f.yaml") and "No input topic" in validate_config(cfg, "f.yaml")[0]
    cfg = _base() | {"output": "persistent://public/default/in"}
    assert "also being used as an input" in _only(validate_config(cfg, "f.yaml"), "Output topic")


def test_user_config_keys_checked_per_class() -> None:
    keys = {"example_function.ExampleFunction": ("prefix", "batchSize")}
    cfg = _base() | {"userConfig": {"prefix": "x", "batchsize": 3}}
    line = _only(validate_config(cfg, "f.yaml", keys), "batchsize")
    assert "'batchsize'" in line and "Valid keys are [batchSize, prefix]" in line
    assert "did you mean 'batchSize'" in line
    # A class without an entry is not checked.
    assert validate_config(cfg, "f.yaml", {"other.Fn": ()}) == []


def test_bad_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tenant: public\ninputs: [persistent://public/default/in\n")
    problems = validate_files([path])
    assert len(problems) == 1 and problems[0].startswith(f"{path}:")
    assert "invalid YAML" in problems[0]
    with pytest.raises(FunctionConfigError, match="invalid YAML"):
        load_function_config(path)


def test_non_mapping_empty_missing_and_duplicate(tmp_path: Path) -> None:
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    dup = tmp_path / "dup.yaml"
    dup.write_text("className: a.B\nclassName: a.C\n")
    missing = tmp_path / "missing.yaml"
    problems = validate_files([listed, empty, dup, missing])
    assert len(problems) == 4, problems
    assert problems[0].startswith(str(listed)) and "mapping" in problems[0]
    assert problems[1].startswith(str(empty)) and "empty" in problems[1]
    assert problems[2].startswith(f"{dup}:2") and "duplicate key 'className'" in problems[2]
    assert problems[3].startswith(str(missing)) and "no such file" in problems[3]


def test_every_problem_line_starts_with_file_name(tmp_path: Path) -> None:
    cfg = _base() | {"maxMessageRetries": 1, "timeoutMs": 1, "bogus": 1, "inputs": ["x"],
                     "processingGuarantees": "EFFECTIVELY_ONCE"}
    path = _write(tmp_path, cfg, "many.yaml")
    problems = validate_files([path])
    assert len(problems) >= 5
    assert all(p.startswith(str(path)) for p in problems)
    assert all("\n" not in p for p in problems)
