"""Pulsar Function config YAML: field list, loader and the spec the local runner uses.

The field names are those of Pulsar's ``org.apache.pulsar.common.functions.FunctionConfig`` and its
nested ``ConsumerConfig``/``ProducerConfig``/``BatchingConfig``/``CryptoConfig``/``Resources``/
``WindowConfig``/``MessagePayloadProcessorConfig`` (Jackson property names, so Lombok's
``boolean isRegexPattern`` appears as ``regexPattern``). A file that loads here is the same file
``pulsar-admin functions create --function-config-file`` takes.
"""

from __future__ import annotations

import logging
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import yaml

from .exceptions import FunctionConfigError

logger = logging.getLogger(__name__)

# Default serde of the Python runtime when a serde class name is empty.
DEFAULT_SERDE = "serde.IdentitySerDe"

# Enum values exactly as Jackson accepts them (case-sensitive).
PROCESSING_GUARANTEES: Tuple[str, ...] = ("ATLEAST_ONCE", "ATMOST_ONCE", "EFFECTIVELY_ONCE", "MANUAL")
SUBSCRIPTION_POSITIONS: Tuple[str, ...] = ("Latest", "Earliest")
COMPRESSION_TYPES: Tuple[str, ...] = ("NONE", "LZ4", "ZLIB", "ZSTD", "SNAPPY")
RUNTIMES: Tuple[str, ...] = ("JAVA", "PYTHON", "GO")
BATCH_BUILDERS: Tuple[str, ...] = ("DEFAULT", "KEY_BASED")
PRODUCER_CRYPTO_FAILURE_ACTIONS: Tuple[str, ...] = ("FAIL", "SEND")
CONSUMER_CRYPTO_FAILURE_ACTIONS: Tuple[str, ...] = ("FAIL", "DISCARD", "CONSUME")
WINDOW_PROCESSING_GUARANTEES: Tuple[str, ...] = ("ATLEAST_ONCE", "ATMOST_ONCE")
#: Schema types the Python runtime knows by name (case-insensitive); anything else must be a
#: "module.Class" custom schema class. "" means bytes + serde.
PYTHON_SCHEMA_TYPES: Tuple[str, ...] = ("", "string", "json", "avro")


# ----------------------------------------------------------------------------------------------
# Field types. A tiny schema language: each field maps to a FieldType; objects carry their own fields.


@dataclass(frozen=True)
class FieldType:
    """The type of one config field (for the loader's and `validate`'s checks)."""

    kind: str  # str | int | bool | number | list_str | map_str | map_any | enum | object | map_object
    values: Tuple[str, ...] = ()
    fields: Optional[Mapping[str, "FieldType"]] = None
    label: str = ""


STR = FieldType("str")
INT = FieldType("int")
BOOL = FieldType("bool")
NUMBER = FieldType("number")
LIST_STR = FieldType("list_str")
MAP_STR = FieldType("map_str")
MAP_ANY = FieldType("map_any")


def enum_type(values: Tuple[str, ...]) -> FieldType:
    """A string that must be one of `values` (case-sensitive, as Jackson reads enums)."""
    return FieldType("enum", values=values)


def object_type(label: str, fields: Mapping[str, FieldType]) -> FieldType:
    """A nested config object; `fields` in the order of Pulsar's Java class (messages list them so)."""
    return FieldType("object", fields=dict(fields), label=label)


CRYPTO = object_type(
    "CryptoConfig",
    {
        "cryptoKeyReaderClassName": STR,
        "cryptoKeyReaderConfig": MAP_ANY,
        "encryptionKeys": LIST_STR,
        "producerCryptoFailureAction": enum_type(PRODUCER_CRYPTO_FAILURE_ACTIONS),
        "consumerCryptoFailureAction": enum_type(CONSUMER_CRYPTO_FAILURE_ACTIONS),
    },
)
BATCHING = object_type(
    "BatchingConfig",
    {
        "enabled": BOOL,
        "batchingMaxPublishDelayMs": INT,
        "roundRobinRouterBatchingPartitionSwitchFrequency": INT,
        "batchingMaxMessages": INT,
        "batchingMaxBytes": INT,
        "batchBuilder": enum_type(BATCH_BUILDERS),
    },
)
PRODUCER = object_type(
    "ProducerConfig",
    {
        "maxPendingMessages": INT,
        "maxPendingMessagesAcrossPartitions": INT,
        "useThreadLocalProducers": BOOL,
        "cryptoConfig": CRYPTO,
        "batchBuilder": enum_type(BATCH_BUILDERS),
        "compressionType": enum_type(COMPRESSION_TYPES),
        "batchingConfig": BATCHING,
    },
)
PAYLOAD_PROCESSOR = object_type(
    "MessagePayloadProcessorConfig",
    {"className": STR, "config": MAP_ANY},
)
CONSUMER = object_type(
    "ConsumerConfig",
    {
        "schemaType": STR,
        "serdeClassName": STR,
        "regexPattern": BOOL,
        "schemaProperties": MAP_STR,
        "consumerProperties": MAP_STR,
        "receiverQueueSize": INT,
        "cryptoConfig": CRYPTO,
        "messagePayloadProcessorConfig": PAYLOAD_PROCESSOR,
        "poolMessages": BOOL,
    },
)
RESOURCES = object_type("Resources", {"cpu": NUMBER, "ram": INT, "disk": INT})
WINDOW = object_type(
    "WindowConfig",
    {
        "windowLengthCount": INT,
        "windowLengthDurationMs": INT,
        "slidingIntervalCount": INT,
        "slidingIntervalDurationMs": INT,
        "lateDataTopic": STR,
        "maxLagMs": INT,
        "watermarkEmitIntervalMs": INT,
        "timestampExtractorClassName": STR,
        "actualWindowFunctionClassName": STR,
        "processingGuarantees": enum_type(WINDOW_PROCESSING_GUARANTEES),
    },
)
#: FunctionConfig itself: every top-level field of a function config YAML and its type.
FUNCTION_CONFIG = object_type(
    "FunctionConfig",
    {
        "runtimeFlags": STR,
        "tenant": STR,
        "namespace": STR,
        "name": STR,
        "className": STR,
        "inputs": LIST_STR,
        "customSerdeInputs": MAP_STR,
        "topicsPattern": STR,
        "customSchemaInputs": MAP_STR,
        "customSchemaOutputs": MAP_STR,
        "inputSpecs": FieldType("map_object", fields=CONSUMER.fields, label="ConsumerConfig"),
        "inputTypeClassName": STR,
        "output": STR,
        "producerConfig": PRODUCER,
        "outputSchemaType": STR,
        "outputTypeClassName": STR,
        "outputSerdeClassName": STR,
        "logTopic": STR,
        "logLevel": STR,
        "processingGuarantees": enum_type(PROCESSING_GUARANTEES),
        "retainOrdering": BOOL,
        "retainKeyOrdering": BOOL,
        "batchBuilder": enum_type(BATCH_BUILDERS),
        "forwardSourceMessageProperty": BOOL,
        "userConfig": MAP_ANY,
        "secrets": MAP_ANY,
        "runtime": enum_type(RUNTIMES),
        "autoAck": BOOL,
        "maxMessageRetries": INT,
        "deadLetterTopic": STR,
        "subName": STR,
        "parallelism": INT,
        "resources": RESOURCES,
        "fqfn": STR,
        "windowConfig": WINDOW,
        "timeoutMs": INT,
        "jar": STR,
        "py": STR,
        "go": STR,
        "functionType": STR,
        "cleanupSubscription": BOOL,
        "customRuntimeOptions": STR,
        "maxPendingAsyncRequests": INT,
        "exposePulsarAdminClientEnabled": BOOL,
        "skipToLatest": BOOL,
        "subscriptionPosition": enum_type(SUBSCRIPTION_POSITIONS),
    },
)


#: Field names of FunctionConfig and its nested classes, in the Java classes' order (derived from
#: the schema above: the names are declared once, with their types).
FUNCTION_CONFIG_FIELDS: Tuple[str, ...] = tuple(FUNCTION_CONFIG.fields or ())
CONSUMER_CONFIG_FIELDS: Tuple[str, ...] = tuple(CONSUMER.fields or ())
PRODUCER_CONFIG_FIELDS: Tuple[str, ...] = tuple(PRODUCER.fields or ())
BATCHING_CONFIG_FIELDS: Tuple[str, ...] = tuple(BATCHING.fields or ())
CRYPTO_CONFIG_FIELDS: Tuple[str, ...] = tuple(CRYPTO.fields or ())
RESOURCES_FIELDS: Tuple[str, ...] = tuple(RESOURCES.fields or ())
WINDOW_CONFIG_FIELDS: Tuple[str, ...] = tuple(WINDOW.fields or ())
MESSAGE_PAYLOAD_PROCESSOR_CONFIG_FIELDS: Tuple[str, ...] = tuple(PAYLOAD_PROCESSOR.fields or ())


class _LineLoader(yaml.SafeLoader):
    """SafeLoader that keeps the composed node so key lines and duplicates can be reported."""


def _walk_nodes(
    node: yaml.Node, path: Tuple[Any, ...], lines: Dict[Tuple[Any, ...], int], dups: List[str]
) -> None:
    """Record the 1-based line of every mapping key and every duplicate key under ``node``."""
    if isinstance(node, yaml.MappingNode):
        seen: Dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node)
            line = key_node.start_mark.line + 1
            if key in seen:
                where = "in " + ".".join(str(p) for p in path) if path else "at top level"
                dups.append(f"{line}: duplicate key '{key}' {where} (first on line {seen[key]})")
            else:
                seen[key] = line
            lines[path + (key,)] = line
            _walk_nodes(value_node, path + (key,), lines, dups)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk_nodes(item, path + (i,), lines, dups)


def load_function_config_with_lines(
    path: Union[str, Path],
) -> Tuple[Dict[str, Any], Dict[Tuple[Any, ...], int]]:
    """Load a function config YAML and return it with the line of each key path.

    Key paths are tuples such as ``("inputSpecs", "persistent://t/n/x", "schemaType")``.
    Raises FunctionConfigError for an unreadable file, invalid YAML, duplicate keys, or a
    document that is not a mapping.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FunctionConfigError(f"{p}: cannot read function config: {exc}") from exc
    try:
        # The reader checks every character when it is built: NUL and control characters raise here.
        loader = _LineLoader(text)
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise FunctionConfigError(
            f"{p}:{line}: invalid YAML: control character {exc.character:#06x} is not allowed (column {column})"
        ) from exc
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        column = f" (column {mark.column + 1})" if mark is not None else ""
        context = f", {exc.context}" if exc.context else ""
        raise FunctionConfigError(f"{where}: invalid YAML: {exc.problem}{context}{column}") from exc
    except yaml.YAMLError as exc:
        raise FunctionConfigError(f"{p}: invalid YAML: {_one_line(str(exc))}") from exc
    finally:
        loader.dispose()
    if data is None:
        raise FunctionConfigError(f"{p}: function config is empty; expected a YAML mapping")
    if not isinstance(data, dict):
        raise FunctionConfigError(
            f"{p}: function config must be a YAML mapping of field names, got {type(data).__name__}"
        )
    lines: Dict[Tuple[Any, ...], int] = {}
    dups: List[str] = []
    assert node is not None  # a document that yields data has a node
    _walk_nodes(node, (), lines, dups)
    if dups:
        raise FunctionConfigError(f"{p}:" + "; ".join(dups))
    logger.debug("loaded function config %s (%d fields)", p, len(data))
    return data, lines


def load_function_config(path: Union[str, Path]) -> Dict[str, Any]:
    """Load a function config YAML file into a dict (no validation beyond "is a mapping").

    Raises FunctionConfigError (a ValueError) naming the file for an unreadable file, invalid
    YAML, a duplicate key, or a document that is not a mapping.
    """
    return load_function_config_with_lines(path)[0]


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def infer_function_name(class_name: str) -> str:
    """The name pulsar-admin infers when ``name`` is absent: the last dot-segment of className."""
    return class_name.rsplit(".", 1)[-1]


def _from(key: str, default: Any = MISSING, *, empty_is_default: bool = False) -> Any:
    """A FunctionSpec field read from FunctionConfig field `key` (its type is the schema's)."""
    meta = {"key": key, "empty_is_default": empty_is_default}
    if isinstance(default, (list, dict)):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class FunctionSpec:
    """A function config resolved with Pulsar's defaults, as the local runner uses it.

    Each field names the FunctionConfig field it is read from (its type is FUNCTION_CONFIG's);
    ``spec_from_config`` is the one reader. ``inputs`` lists every input topic (``inputs``,
    ``inputSpecs`` keys, ``customSerdeInputs`` and ``customSchemaInputs`` keys, and
    ``topicsPattern``) in first-seen order; ``input_specs`` maps each to ``{"receiverQueueSize",
    "schemaType", "serdeClassName", "regexPattern"}``, where an empty schemaType means bytes +
    serde and an empty serdeClassName means ``serde.IdentitySerDe``, exactly as in the Python runtime.
    """

    class_name: str = _from("className")
    name: str = _from("name")
    tenant: str = _from("tenant", "public", empty_is_default=True)
    namespace: str = _from("namespace", "default", empty_is_default=True)
    inputs: List[str] = _from("inputs", [])
    input_specs: Dict[str, Dict[str, Any]] = _from("inputSpecs", {})
    output: Optional[str] = _from("output", None, empty_is_default=True)
    output_serde_class_name: str = _from("outputSerdeClassName", "")
    output_schema_type: str = _from("outputSchemaType", "")
    input_type_class_name: Optional[str] = _from("inputTypeClassName", None)
    output_type_class_name: Optional[str] = _from("outputTypeClassName", None)
    log_topic: Optional[str] = _from("logTopic", None, empty_is_default=True)
    processing_guarantees: str = _from("processingGuarantees", "ATLEAST_ONCE")
    auto_ack: bool = _from("autoAck", True)
    sub_name: str = _from("subName", "")
    subscription_position: str = _from("subscriptionPosition", "Latest")
    timeout_ms: Optional[int] = _from("timeoutMs", None)
    parallelism: int = _from("parallelism", 1)
    user_config: Dict[str, Any] = _from("userConfig", {})
    secrets: Dict[str, Any] = _from("secrets", {})
    producer_config: Dict[str, Any] = _from("producerConfig", {})
    retain_ordering: bool = _from("retainOrdering", False)
    retain_key_ordering: bool = _from("retainKeyOrdering", False)
    forward_source_message_property: bool = _from("forwardSourceMessageProperty", True)
    cleanup_subscription: bool = _from("cleanupSubscription", True)
    py: Optional[str] = _from("py", None)

    def __post_init__(self) -> None:
        if not self.sub_name:
            self.sub_name = f"{self.tenant}/{self.namespace}/{self.name}"

    @property
    def fqfn(self) -> str:
        """Fully qualified function name ``tenant/namespace/name``."""
        return f"{self.tenant}/{self.namespace}/{self.name}"


# FunctionSpec field -> FunctionConfig key, for overrides given by spec field name.
_SPEC_TO_CONFIG_KEY: Dict[str, str] = {f.name: f.metadata["key"] for f in fields(FunctionSpec)}
assert set(_SPEC_TO_CONFIG_KEY.values()) <= set(FUNCTION_CONFIG_FIELDS)

# Python type of a schema kind, for the spec's type checks.
_PYTHON_TYPES: Dict[str, type] = {"str": str, "enum": str, "int": int, "bool": bool, "list_str": list,
                                  "map_str": dict, "map_any": dict, "map_object": dict, "object": dict}


def _typed(cfg: Mapping[str, Any], key: str, kind: Union[type, Tuple[type, ...]], default: Any) -> Any:
    """cfg[key] if present and of ``kind`` (bool is not an int here), else a clear error."""
    value = cfg.get(key)
    if value is None:
        return default
    bad_bool = isinstance(value, bool) and kind in (int, (int,))
    if not isinstance(value, kind) or bad_bool:
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise FunctionConfigError(
            f"function config field '{key}' must be {expected}, got {type(value).__name__} {value!r}"
        )
    return value


def _empty_input_spec() -> Dict[str, Any]:
    return {"receiverQueueSize": None, "schemaType": "", "serdeClassName": "", "regexPattern": False}


def _input_specs(cfg: Mapping[str, Any]) -> Tuple[List[str], Dict[str, Dict[str, Any]]]:
    """Merge the four ways FunctionConfig names inputs the way FunctionConfigUtils.convert does."""
    specs: Dict[str, Dict[str, Any]] = {}

    def spec_for(topic: Any, key: str) -> Dict[str, Any]:
        if not isinstance(topic, str) or not topic:
            raise FunctionConfigError(f"function config field '{key}' has a non-string topic {topic!r}")
        return specs.setdefault(topic, _empty_input_spec())

    for topic in _typed(cfg, "inputs", list, []):
        spec_for(topic, "inputs")
    for topic, serde in _typed(cfg, "customSerdeInputs", dict, {}).items():
        spec_for(topic, "customSerdeInputs")["serdeClassName"] = serde or ""
    pattern = _typed(cfg, "topicsPattern", str, None)
    if pattern:
        spec_for(pattern, "topicsPattern")["regexPattern"] = True
    for topic, conf in _typed(cfg, "customSchemaInputs", dict, {}).items():
        spec = spec_for(topic, "customSchemaInputs")
        parsed = _parse_custom_schema_input(topic, conf)
        spec.update({k: v for k, v in parsed.items() if k in spec})
    for topic, conf in _typed(cfg, "inputSpecs", dict, {}).items():
        spec = spec_for(topic, "inputSpecs")
        if conf is None:
            continue
        if not isinstance(conf, dict):
            raise FunctionConfigError(
                f"function config inputSpecs['{topic}'] must be a mapping, got {type(conf).__name__}"
            )
        for k in ("receiverQueueSize", "schemaType", "serdeClassName", "regexPattern"):
            if conf.get(k) is not None:
                spec[k] = conf[k]
    return list(specs), specs


def _parse_custom_schema_input(topic: str, conf: Any) -> Dict[str, Any]:
    """customSchemaInputs values are a ConsumerConfig JSON (newer Pulsar) or a bare schema type."""
    import json

    if conf is None:
        return {}
    if not isinstance(conf, str):
        raise FunctionConfigError(
            f"function config customSchemaInputs['{topic}'] must be a string, got {type(conf).__name__}"
        )
    if conf.lstrip().startswith("{"):
        try:
            parsed = json.loads(conf)
        except ValueError as exc:
            raise FunctionConfigError(
                f"function config customSchemaInputs['{topic}'] is not valid ConsumerConfig JSON: {exc}"
            ) from exc
        if not isinstance(parsed, dict):
            raise FunctionConfigError(f"function config customSchemaInputs['{topic}'] must be a JSON object")
        return parsed
    return {"schemaType": conf}


def _normalise_overrides(overrides: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """Map override keys (config camelCase or FunctionSpec snake_case) to config keys; drop Nones."""
    out: Dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in _SPEC_TO_CONFIG_KEY:
            out[_SPEC_TO_CONFIG_KEY[key]] = value
        elif key in FUNCTION_CONFIG_FIELDS:
            out[key] = value
        else:
            valid = sorted(set(FUNCTION_CONFIG_FIELDS) | set(_SPEC_TO_CONFIG_KEY))
            raise FunctionConfigError(f"unknown override '{key}'. Valid overrides are [{', '.join(valid)}]")
    return out


def merged_config(cfg: Mapping[str, Any], overrides: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The config as the function will run it: ``cfg`` with the given overrides (see spec_from_config)."""
    if not isinstance(cfg, Mapping):
        raise FunctionConfigError(f"function config must be a mapping, got {type(cfg).__name__}")
    merged: Dict[str, Any] = dict(cfg)
    merged.update(_normalise_overrides(overrides))
    return merged


def spec_from_config(cfg: Mapping[str, Any], overrides: Optional[Mapping[str, Any]] = None) -> FunctionSpec:
    """Resolve a loaded config (plus CLI-style overrides) into a FunctionSpec with Pulsar's defaults.

    ``overrides`` keys may be FunctionConfig keys (``subName``) or FunctionSpec field names
    (``sub_name``); a None value means "not given" and leaves the config's value. Overrides replace
    whole values (like pulsar-admin flags), they do not merge maps. Like ``functions localrun``,
    this does not apply the ``functions create`` Python checks: use ``validate.validate_config``.
    Raises FunctionConfigError when className is missing or a field used here has the wrong type.
    """
    merged = merged_config(cfg, overrides)

    class_name = _typed(merged, "className", str, "")
    if not class_name:
        raise FunctionConfigError("function config has no 'className' (required for Python functions)")
    inputs, input_specs = _input_specs(merged)
    values: Dict[str, Any] = {"class_name": class_name, "inputs": inputs, "input_specs": input_specs,
                              "name": _typed(merged, "name", str, "") or infer_function_name(class_name)}
    for f in fields(FunctionSpec):
        if f.name in values:
            continue
        key = f.metadata["key"]
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        value = _typed(merged, key, _PYTHON_TYPES[FUNCTION_CONFIG.fields[key].kind], default)  # type: ignore[index]
        if f.metadata["empty_is_default"] and not value:
            value = default
        values[f.name] = dict(value) if isinstance(value, dict) else value
    spec = FunctionSpec(**values)
    logger.debug("function spec %s: inputs=%s output=%s", spec.fqfn, spec.inputs, spec.output)
    return spec
