"""FunctionSpec: Pulsar's defaults, name inference, input merging and overrides."""
from __future__ import annotations

import pytest

from pulsar_lifecycle.config.function_config import (
    FunctionConfigError,
    FunctionSpec,
    infer_function_name,
    load_function_config,
    spec_from_config,
)
from support.paths import REPO


def test_defaults() -> None:
    spec = spec_from_config({"className": "pkg.mod.MyFunction", "inputs": ["persistent://public/default/in"]})
    assert spec.tenant == "public"
    assert spec.namespace == "default"
    assert spec.name == "MyFunction"
    assert spec.class_name == "pkg.mod.MyFunction"
    assert spec.sub_name == "public/default/MyFunction"
    assert spec.fqfn == "public/default/MyFunction"
    assert spec.processing_guarantees == "ATLEAST_ONCE"
    assert spec.auto_ack is True
    assert spec.subscription_position == "Latest"
    assert spec.timeout_ms is None
    assert spec.parallelism == 1
    assert spec.forward_source_message_property is True
    assert spec.cleanup_subscription is True
    assert spec.retain_ordering is False and spec.retain_key_ordering is False
    assert spec.output is None and spec.log_topic is None and spec.py is None
    assert spec.user_config == {} and spec.secrets == {} and spec.producer_config == {}
    assert spec.inputs == ["persistent://public/default/in"]
    assert spec.input_specs == {"persistent://public/default/in": {
        "receiverQueueSize": None, "schemaType": "", "serdeClassName": "", "regexPattern": False}}


def test_name_inference_like_pulsar_admin() -> None:
    assert infer_function_name("a.b.C") == "C"
    assert infer_function_name("module_only") == "module_only"
    assert spec_from_config({"className": "x.Y", "name": "explicit"}).name == "explicit"


def test_sub_name_follows_tenant_namespace_name() -> None:
    spec = spec_from_config({"className": "m.F", "tenant": "t", "namespace": "ns", "name": "n"})
    assert spec.sub_name == "t/ns/n"
    assert spec_from_config({"className": "m.F", "subName": "mine"}).sub_name == "mine"


def test_inputs_merge_all_sources_in_order() -> None:
    cfg = {
        "className": "m.F",
        "inputs": ["persistent://public/default/a"],
        "customSerdeInputs": {"persistent://public/default/b": "serde.PickleSerDe"},
        "customSchemaInputs": {"persistent://public/default/c": "string",
                               "persistent://public/default/d": '{"schemaType": "json", "receiverQueueSize": 7}'},
        "inputSpecs": {"persistent://public/default/a": {"receiverQueueSize": 5},
                       "persistent://public/default/e-.*": {"regexPattern": True}},
    }
    spec = spec_from_config(cfg)
    assert spec.inputs == ["persistent://public/default/a", "persistent://public/default/b",
                           "persistent://public/default/c", "persistent://public/default/d",
                           "persistent://public/default/e-.*"]
    assert spec.input_specs["persistent://public/default/a"]["receiverQueueSize"] == 5
    assert spec.input_specs["persistent://public/default/b"]["serdeClassName"] == "serde.PickleSerDe"
    assert spec.input_specs["persistent://public/default/c"]["schemaType"] == "string"
    assert spec.input_specs["persistent://public/default/d"]["schemaType"] == "json"
    assert spec.input_specs["persistent://public/default/d"]["receiverQueueSize"] == 7
    assert spec.input_specs["persistent://public/default/e-.*"]["regexPattern"] is True


def test_values_are_carried() -> None:
    cfg = {"className": "m.F", "output": "persistent://public/default/o", "logTopic": "persistent://public/default/l",
           "processingGuarantees": "MANUAL", "autoAck": False, "subscriptionPosition": "Earliest",
           "timeoutMs": 30000, "parallelism": 3, "userConfig": {"k": 1}, "secrets": {"s": "v"},
           "producerConfig": {"compressionType": "LZ4"}, "retainOrdering": True,
           "forwardSourceMessageProperty": False, "cleanupSubscription": False, "py": "dist/x.zip",
           "outputSerdeClassName": "serde.PickleSerDe"}
    spec = spec_from_config(cfg)
    assert (spec.output, spec.log_topic) == ("persistent://public/default/o", "persistent://public/default/l")
    assert spec.processing_guarantees == "MANUAL" and spec.auto_ack is False
    assert spec.subscription_position == "Earliest" and spec.timeout_ms == 30000 and spec.parallelism == 3
    assert spec.user_config == {"k": 1} and spec.secrets == {"s": "v"}
    assert spec.producer_config == {"compressionType": "LZ4"}
    assert spec.retain_ordering is True and spec.forward_source_message_property is False
    assert spec.cleanup_subscription is False and spec.py == "dist/x.zip"
    assert spec.output_serde_class_name == "serde.PickleSerDe"


def test_overrides_by_config_key_or_spec_field() -> None:
    cfg = {"className": "m.F", "parallelism": 1, "userConfig": {"a": 1}}
    spec = spec_from_config(cfg, {"parallelism": 4, "user_config": {"b": 2}, "tenant": None, "subName": "s"})
    assert spec.parallelism == 4
    assert spec.user_config == {"b": 2}  # replaced, like a pulsar-admin flag
    assert spec.tenant == "public"  # None means "not given"
    assert spec.sub_name == "s"
    assert cfg["userConfig"] == {"a": 1}  # the loaded config is not mutated
    with pytest.raises(FunctionConfigError, match="unknown override 'paralelism'"):
        spec_from_config(cfg, {"paralelism": 2})


def test_missing_class_name_and_bad_types_are_clear() -> None:
    with pytest.raises(FunctionConfigError, match="className"):
        spec_from_config({"inputs": ["persistent://public/default/in"]})
    with pytest.raises(FunctionConfigError, match="'parallelism' must be int"):
        spec_from_config({"className": "m.F", "parallelism": True})
    with pytest.raises(FunctionConfigError, match="'inputs' must be list"):
        spec_from_config({"className": "m.F", "inputs": "persistent://public/default/in"})


def test_shipped_configs_make_specs() -> None:
    configs = sorted((REPO / "function-configs").glob("*.yaml"))
    assert configs
    for path in configs:
        spec = spec_from_config(load_function_config(path))
        assert isinstance(spec, FunctionSpec)
        assert spec.inputs, path
        assert "." in spec.class_name, path


def test_function_config_is_declared_once() -> None:
    """One schema (FUNCTION_CONFIG: field names and types) serves the loader's spec, the field
    lists and `validate`; every FunctionSpec field names the FunctionConfig field it reads."""
    from dataclasses import fields

    from pulsar_lifecycle.config import validate
    from pulsar_lifecycle.config.function_config import FUNCTION_CONFIG, FUNCTION_CONFIG_FIELDS

    assert validate.FUNCTION_CONFIG is FUNCTION_CONFIG
    assert FUNCTION_CONFIG_FIELDS == tuple(FUNCTION_CONFIG.fields or ())
    keys = [f.metadata["key"] for f in fields(FunctionSpec)]
    assert set(keys) <= set(FUNCTION_CONFIG_FIELDS) and len(keys) == len(set(keys))
    # The spec's type checks follow the schema's types (a bool field refuses a string; an enum is a string).
    with pytest.raises(FunctionConfigError, match="'retainOrdering' must be bool"):
        spec_from_config({"className": "m.F", "retainOrdering": "yes"})
    with pytest.raises(FunctionConfigError, match="'processingGuarantees' must be str"):
        spec_from_config({"className": "m.F", "processingGuarantees": 1})
