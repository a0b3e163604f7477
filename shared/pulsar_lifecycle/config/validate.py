"""Validate function config YAMLs for where they will run (config/targets.py).

Every problem becomes one line starting with the file name (and the line number when known).
For the default target, `cluster`, a config that passes is accepted by ``pulsar-admin functions
create`` and starts under Pulsar's Python runtime on workers with function state: unknown fields
(at any depth, listing the valid ones like pulsar-admin's "Invalid field ... Valid fields are
[...]"), wrong types, bad enum values, the Python checks of
``FunctionConfigUtils.doPythonChecks``/``doCommonChecks``, topic-name format, schema types, and
optionally the userConfig keys each function class reads, the class's own checks and its checks
for the target (``target_checks``: what would fail at start-up or on the first message there).
For `localrun` the worker's checks are left out (``pulsar-admin functions localrun`` skips them
too, and the local run mode accepts short topic names); the rest is the same.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..topics import FULL_NAME_PREFIXES, TopicName, TopicNameError, is_named_entity
from .exceptions import ConfigError
from .function_config import (
    BOOL,
    CONSUMER,
    FUNCTION_CONFIG,
    INT,
    LIST_STR,
    MAP_ANY,
    NUMBER,
    PROCESSING_GUARANTEES,
    PYTHON_SCHEMA_TYPES,
    RESOURCES_FIELDS,
    RUNTIMES,
    STR,
    FieldType,
    FunctionConfigError,
    load_function_config_with_lines,
)
from .system import FunctionTopology, system_problems
from .targets import CLUSTER, TARGETS

logger = logging.getLogger(__name__)

#: Smallest ack timeout the Python client accepts (it raises at subscribe below this).
MIN_PYTHON_TIMEOUT_MS = 10_000

TOPIC_SCHEMES: Tuple[str, ...] = FULL_NAME_PREFIXES
_CLASS_NAME_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_PY_URL_SCHEMES = ("http://", "https://", "file://", "function://")
_USER_CONFIG_KEY_RE = re.compile(r"^userConfig (\w+)")

KeyPath = Tuple[Any, ...]
FunctionCheck = Callable[[Mapping[str, Any]], List[str]]
#: A function class's checks of a config for one target: (config, target) -> problems.
TargetCheck = Callable[[Mapping[str, Any], str], List[str]]


_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "bool": "a boolean (true/false)",
    "number": "a number",
    "list_str": "a list of strings",
    "map_str": "a mapping of string to string",
    "map_any": "a mapping",
    "object": "a mapping",
    "map_object": "a mapping",
}


# ----------------------------------------------------------------------------------------------


@dataclass
class _Report:
    """Collects problem lines for one file."""

    path: str
    lines: Mapping[KeyPath, int]
    problems: List[str] = field(default_factory=list)

    def add(self, where: KeyPath, message: str) -> None:
        line = None
        # The nearest key with a known line: a problem inside a value points at its key.
        for cut in range(len(where), 0, -1):
            line = self.lines.get(tuple(where[:cut]))
            if line is not None:
                break
        prefix = f"{self.path}:{line}" if line is not None else self.path
        self.problems.append(f"{prefix}: {message}")


def _show(where: KeyPath) -> str:
    """Render a key path as ``inputSpecs['persistent://t/n/x'].schemaType``."""
    out = ""
    for part in where:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "top level"


def _type_ok(value: Any, t: FieldType) -> bool:
    kind = t.kind
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "list_str":
        return isinstance(value, list)
    if kind in ("map_str", "map_any", "object", "map_object"):
        return isinstance(value, dict)
    if kind == "enum":
        return isinstance(value, str)
    raise AssertionError(kind)


def _type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
            float: "number"}.get(type(value), type(value).__name__)


def _unknown_field(report: _Report, where: KeyPath, key: Any, known: Collection[str], label: str) -> None:
    hint = ""
    if isinstance(key, str):
        close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
        if close:
            hint = f" (did you mean '{close[0]}'?)"
    container = f"in {_show(where)} ({label})" if where else f"at top level ({label})"
    report.add(
        where + (key,),
        f"Invalid field '{key}' {container}{hint}. Valid fields are [{', '.join(known)}]",
    )


def _check_value(report: _Report, where: KeyPath, value: Any, t: FieldType) -> None:
    """Type-check one value (None means "unset", as Jackson reads an empty YAML value)."""
    if value is None:
        return
    if not _type_ok(value, t):
        report.add(where, f"{_show(where)} must be {_TYPE_WORDS.get(t.kind, t.kind)}, "
                          f"got {_type_name(value)} {value!r}")
        return
    if t.kind == "enum" and value not in t.values:
        close = [v for v in t.values if v.lower() == value.lower()]
        hint = f" (enum values are case-sensitive: did you mean '{close[0]}'?)" if close else ""
        report.add(where, f"{_show(where)} has invalid value '{value}'{hint}; "
                          f"expected one of [{', '.join(t.values)}]")
    elif t.kind == "list_str":
        for i, item in enumerate(value):
            if not isinstance(item, str):
                report.add(where + (i,), f"{_show(where + (i,))} must be a string, "
                                         f"got {_type_name(item)} {item!r}")
    elif t.kind in ("map_str", "map_any"):
        for k, v in value.items():
            if not isinstance(k, str):
                report.add(where, f"{_show(where)} has a non-string key {k!r}")
            elif t.kind == "map_str" and v is not None and not isinstance(v, str):
                report.add(where + (k,), f"{_show(where + (k,))} must be a string, "
                                         f"got {_type_name(v)} {v!r}")
    elif t.kind == "object":
        _check_object(report, where, value, t)
    elif t.kind == "map_object":
        member = FieldType("object", fields=t.fields, label=t.label)
        for k, v in value.items():
            if not isinstance(k, str):
                report.add(where, f"{_show(where)} has a non-string key {k!r}")
            else:
                _check_value(report, where + (k,), v, member)


def _check_object(report: _Report, where: KeyPath, obj: Mapping[Any, Any], t: FieldType) -> None:
    assert t.fields is not None
    for key, value in obj.items():
        sub = t.fields.get(key) if isinstance(key, str) else None
        if sub is None:
            _unknown_field(report, where, key, list(t.fields), t.label)
        else:
            _check_value(report, where + (key,), value, sub)


# ----------------------------------------------------------------------------------------------
# Semantic checks (only on values whose type was right; type errors were reported already).


def topic_problem(topic: str, *, regex: bool = False) -> Optional[str]:
    """Why ``topic`` is not a fully qualified ``persistent://tenant/namespace/topic`` name, or None.

    ``regex`` relaxes the local-name check for topicsPattern / regexPattern input specs.
    """
    scheme = next((s for s in TOPIC_SCHEMES if topic.startswith(s)), None)
    if scheme is None:
        return (f"topic '{topic}' is not fully qualified; write persistent://tenant/namespace/topic "
                f"(the runtime's context.ack() and topic names in messages use the full name)")
    # Stricter than TopicName (which keeps a '/' in the local name): a function's topic has 3 parts.
    parts = topic[len(scheme):].split("/")
    if len(parts) != 3:
        return (f"topic '{topic}' must have exactly tenant/namespace/topic after {scheme} "
                f"(got {len(parts)} part{'s' if len(parts) != 1 else ''})")
    for label, value in (("tenant", parts[0]), ("namespace", parts[1])):
        if not is_named_entity(value):
            return f"topic '{topic}' has an invalid {label} '{value}' (allowed: letters, digits, - _ = : .)"
    if not parts[2]:
        return f"topic '{topic}' has an empty topic name"
    try:
        name = TopicName.parse(topic)
    except TopicNameError as exc:
        return str(exc)
    if not regex and any(c.isspace() for c in name.local_name):
        return f"topic '{topic}' contains whitespace"
    return None


def _check_topic(report: _Report, where: KeyPath, topic: Any, *, regex: bool = False,
                 target: str = CLUSTER) -> None:
    if isinstance(topic, str):
        if target != CLUSTER and not topic.startswith(TOPIC_SCHEMES):
            return  # the local run mode qualifies a short name itself
        problem = topic_problem(topic, regex=regex)
        if problem:
            report.add(where, f"{_show(where)}: {problem}")


def _schema_problem(schema_type: str) -> Optional[str]:
    if schema_type.lower() in PYTHON_SCHEMA_TYPES:
        return None
    if "." in schema_type and _CLASS_NAME_RE.match(schema_type):
        return None  # a custom schema class, imported by the runtime
    return (f"schema type '{schema_type}' is not one the Python runtime knows; use '' (bytes + serde), "
            f"string, json, avro or a custom schema class 'module.Class'")


def _check_schema(report: _Report, where: KeyPath, schema_type: Any, type_class: Any, type_key: str) -> None:
    if not isinstance(schema_type, str):
        return
    problem = _schema_problem(schema_type)
    if problem:
        report.add(where, f"{_show(where)}: {problem}")
    elif schema_type.lower() in ("json", "avro") and not type_class:
        report.add(where, f"{_show(where)}: schema type '{schema_type}' needs '{type_key}' "
                          f"(the Record class the Python runtime builds the schema from)")


def _check_class_name(report: _Report, where: KeyPath, value: Any, what: str) -> None:
    if isinstance(value, str) and value and not _CLASS_NAME_RE.match(value):
        report.add(where, f"{_show(where)}: '{value}' is not a Python {what} name ('module.Class')")


def _is_topic_key(key: str) -> bool:
    return key.lower().endswith(("topic", "topics"))


def _semantic_checks(
    report: _Report,
    cfg: Mapping[str, Any],
    user_config_keys: Optional[Mapping[str, Collection[str]]],
    function_checks: Optional[Mapping[str, FunctionCheck]] = None,
    *,
    target: str = CLUSTER,
    target_checks: Optional[Mapping[str, TargetCheck]] = None,
) -> None:
    def get(key: str, t: FieldType) -> Any:
        value = cfg.get(key)
        return value if value is not None and _type_ok(value, t) else None

    # --- identity and code -----------------------------------------------------------------
    class_name = get("className", STR)
    if not class_name:
        report.add(("className",) if "className" in cfg else (),
                   "className is required for Python functions (module.Class)")
    else:
        _check_class_name(report, ("className",), class_name, "class")
    for key in ("tenant", "namespace"):
        value = get(key, STR)
        if value is not None and not is_named_entity(value):
            report.add((key,), f"{key} '{value}' is invalid (allowed: letters, digits, - _ = : .)")
    name = get("name", STR)
    if name is not None and ("/" in name or not name.strip()):
        report.add(("name",), f"name '{name}' is invalid (no '/' and not blank)")
    runtime = get("runtime", STR)
    if runtime is not None and runtime in RUNTIMES and runtime != "PYTHON":
        report.add(("runtime",), f"runtime is {runtime}, but these are Python functions (use PYTHON or omit it)")
    for key in ("jar", "go"):
        if cfg.get(key) is not None:
            report.add((key,), f"'{key}' is for {'Java' if key == 'jar' else 'Go'} functions; "
                               f"a Python function uses 'py'")
    py = get("py", STR)
    if py is not None and not (py.startswith(_PY_URL_SCHEMES) or py.endswith((".py", ".zip", ".whl"))):
        report.add(("py",), f"py '{py}' must be a .py, .zip or .whl file or a "
                            f"{'/'.join(s[:-3] for s in _PY_URL_SCHEMES)} URL")

    guarantees = get("processingGuarantees", STR)
    timeout = get("timeoutMs", INT)
    if timeout is not None and 0 < timeout < MIN_PYTHON_TIMEOUT_MS:
        report.add(("timeoutMs",),
                   f"timeoutMs ({timeout}) is below {MIN_PYTHON_TIMEOUT_MS}: the Python client rejects "
                   f"an ack timeout under 10 seconds and the instance fails to start")
    if target == CLUSTER:
        _worker_checks(report, cfg, get, guarantees, timeout)
    _topic_and_schema_checks(report, cfg, get, target)
    _check_function(report, cfg, class_name, get("userConfig", MAP_ANY) or {}, user_config_keys, function_checks,
                    target=target, target_checks=target_checks)


def _worker_checks(report: _Report, cfg: Mapping[str, Any], get: Callable[[str, FieldType], Any],
                   guarantees: Optional[str], timeout: Optional[int]) -> None:
    """The Python-runtime rules of FunctionConfigUtils.doPythonChecks / doCommonChecks, which
    `functions create` applies (and `pulsar-admin functions localrun` does not)."""
    if guarantees == "EFFECTIVELY_ONCE":
        report.add(("processingGuarantees",),
                   "processingGuarantees EFFECTIVELY_ONCE: Effectively-once processing guarantees "
                   "not yet supported in Python (pulsar-admin functions create rejects it)")
    if cfg.get("windowConfig") is not None:
        report.add(("windowConfig",), "windowConfig: There is currently no support windowing in python")
    retries = get("maxMessageRetries", INT)
    if retries is not None and retries >= 0:
        report.add(("maxMessageRetries",),
                   f"maxMessageRetries ({retries}): Message retries not yet supported in python "
                   f"(pulsar-admin functions create rejects it; retry in the function's own code)")
    if cfg.get("deadLetterTopic") is not None:
        report.add(("deadLetterTopic",),
                   "deadLetterTopic: Dead Letter Topic specified, however max retries is set to infinity "
                   "(a DLQ needs maxMessageRetries, which Python functions cannot set; "
                   "publish to a DLQ from the function's own code)")
    if timeout is not None:
        if timeout <= 0:
            report.add(("timeoutMs",), f"timeoutMs ({timeout}): Function timeout must be a positive number")
        if guarantees in PROCESSING_GUARANTEES and guarantees != "ATLEAST_ONCE":
            report.add(("timeoutMs",), f"timeoutMs: Message timeout can only be specified with "
                                       f"processing guarantee is ATLEAST_ONCE (is {guarantees})")
    parallelism = get("parallelism", INT)
    if parallelism is not None and parallelism <= 0:
        report.add(("parallelism",), f"parallelism ({parallelism}): Function parallelism must be a positive number")
    if get("retainOrdering", BOOL) and get("retainKeyOrdering", BOOL):
        report.add(("retainKeyOrdering",), "retainOrdering and retainKeyOrdering cannot both be true")
    if get("retainKeyOrdering", BOOL) and guarantees == "EFFECTIVELY_ONCE":
        report.add(("retainKeyOrdering",), "retainKeyOrdering cannot be combined with EFFECTIVELY_ONCE")
    resources = get("resources", MAP_ANY) or {}
    for key in RESOURCES_FIELDS:
        value = resources.get(key)
        if _type_ok(value, NUMBER) and value is not None and value <= 0:
            report.add(("resources", key), f"resources.{key} ({value}) must be positive")
    for key in ("maxPendingAsyncRequests",):
        value = get(key, INT)
        if value is not None and value <= 0:
            report.add((key,), f"{key} ({value}) must be positive")


def _topic_and_schema_checks(report: _Report, cfg: Mapping[str, Any], get: Callable[[str, FieldType], Any],
                             target: str) -> None:
    # --- topics -----------------------------------------------------------------------------
    input_topics: List[str] = []
    for i, topic in enumerate(get("inputs", LIST_STR) or []):
        _check_topic(report, ("inputs", i), topic, target=target)
        if isinstance(topic, str):
            input_topics.append(topic)
    for key in ("customSerdeInputs", "customSchemaInputs"):
        for topic in get(key, MAP_ANY) or {}:
            if isinstance(topic, str):
                _check_topic(report, (key, topic), topic, target=target)
                input_topics.append(topic)
    specs = get("inputSpecs", MAP_ANY) or {}
    for topic, spec in specs.items():
        if not isinstance(topic, str):
            continue
        regex = isinstance(spec, dict) and spec.get("regexPattern") is True
        _check_topic(report, ("inputSpecs", topic), topic, regex=regex, target=target)
        input_topics.append(topic)
    pattern = get("topicsPattern", STR)
    if pattern is not None:
        _check_topic(report, ("topicsPattern",), pattern, regex=True, target=target)
        input_topics.append(pattern)
    if not input_topics:
        report.add((), "No input topic(s) specified for the function "
                       "(set inputs, inputSpecs, topicsPattern, customSerdeInputs or customSchemaInputs)")
    output = get("output", STR)
    if output:
        _check_topic(report, ("output",), output, target=target)
        if output in input_topics:
            report.add(("output",), f"Output topic {output} is also being used as an input topic "
                                    f"(topics must be one or the other)")
    for key in ("logTopic", "deadLetterTopic"):
        value = get(key, STR)
        if value:
            _check_topic(report, (key,), value, target=target)
    for topic in get("customSchemaOutputs", MAP_ANY) or {}:
        if isinstance(topic, str):
            _check_topic(report, ("customSchemaOutputs", topic), topic, target=target)
    user_config = get("userConfig", MAP_ANY) or {}
    for key, value in user_config.items():
        if not (isinstance(key, str) and _is_topic_key(key)):
            continue
        values = value if isinstance(value, list) else [value]
        for i, item in enumerate(values):
            # Only values that claim to be full topic names are checked: a userConfig "topic" may
            # legitimately be a short name or a suffix the function qualifies itself.
            if isinstance(item, str) and item.startswith(TOPIC_SCHEMES):
                where = ("userConfig", key, i) if isinstance(value, list) else ("userConfig", key)
                _check_topic(report, where, item, target=target)

    # --- schemas and serdes -----------------------------------------------------------------
    input_type = get("inputTypeClassName", STR)
    for topic, spec in specs.items():
        if isinstance(topic, str) and isinstance(spec, dict):
            _check_schema(report, ("inputSpecs", topic, "schemaType"), spec.get("schemaType"),
                          input_type, "inputTypeClassName")
            _check_class_name(report, ("inputSpecs", topic, "serdeClassName"), spec.get("serdeClassName"), "serde class")
    for topic, conf in (get("customSchemaInputs", MAP_ANY) or {}).items():
        if not (isinstance(topic, str) and isinstance(conf, str)):
            continue
        where = ("customSchemaInputs", topic)
        if conf.lstrip().startswith("{"):
            try:
                parsed = json.loads(conf)
            except ValueError as exc:
                report.add(where, f"{_show(where)} is not valid ConsumerConfig JSON: {exc}")
                continue
            if not isinstance(parsed, dict):
                report.add(where, f"{_show(where)} must be a JSON object (a ConsumerConfig)")
                continue
            _check_object(report, where, parsed, CONSUMER)
            _check_schema(report, where, parsed.get("schemaType"), input_type, "inputTypeClassName")
        else:
            _check_schema(report, where, conf, input_type, "inputTypeClassName")
    for topic, serde in (get("customSerdeInputs", MAP_ANY) or {}).items():
        if isinstance(topic, str):
            _check_class_name(report, ("customSerdeInputs", topic), serde, "serde class")
    _check_schema(report, ("outputSchemaType",), get("outputSchemaType", STR),
                  get("outputTypeClassName", STR), "outputTypeClassName")
    _check_class_name(report, ("outputSerdeClassName",), get("outputSerdeClassName", STR), "serde class")
    for key in ("inputTypeClassName", "outputTypeClassName"):
        _check_class_name(report, (key,), get(key, STR), "class")


def _check_function(
    report: _Report,
    cfg: Mapping[str, Any],
    class_name: Optional[str],
    user_config: Mapping[str, Any],
    user_config_keys: Optional[Mapping[str, Collection[str]]],
    function_checks: Optional[Mapping[str, FunctionCheck]],
    *,
    target: str = CLUSTER,
    target_checks: Optional[Mapping[str, TargetCheck]] = None,
) -> None:
    """The checks that belong to the function class itself: its userConfig keys, its own rules
    and what would fail where the config will run (`target`)."""
    # --- userConfig keys the function class reads -------------------------------------------
    if user_config_keys is not None and class_name and class_name in user_config_keys:
        known = sorted(user_config_keys[class_name])
        for key in user_config:
            if key not in user_config_keys[class_name]:
                close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                report.add(("userConfig", key),
                           f"userConfig key '{key}' is not read by {class_name}{hint}. "
                           f"Valid keys are [{', '.join(known)}]")

    # --- the function class's own checks (values, inputs) --------------------------------
    if function_checks is not None and class_name and class_name in function_checks:
        for message in function_checks[class_name](cfg):
            report.add(("userConfig",), f"{class_name}: {message}")
    if target_checks is not None and class_name and class_name in target_checks:
        for message in target_checks[class_name](cfg, target):
            # A message naming "userConfig <key>" points at that key's line when the key is there.
            named = _USER_CONFIG_KEY_RE.match(message)
            named_key = named.group(1) if named and named.group(1) in user_config else None
            where: KeyPath = ("userConfig", named_key) if named_key else ("userConfig",)
            report.add(where, f"{class_name} ({target}): {message}")


# ----------------------------------------------------------------------------------------------


def _validate(
    cfg: Any,
    path: str,
    user_config_keys: Optional[Mapping[str, Collection[str]]],
    lines: Mapping[KeyPath, int],
    function_checks: Optional[Mapping[str, FunctionCheck]] = None,
    *,
    target: str = CLUSTER,
    target_checks: Optional[Mapping[str, TargetCheck]] = None,
) -> List[str]:
    report = _Report(path=path, lines=lines)
    if not isinstance(cfg, Mapping):
        report.add((), f"function config must be a mapping of field names, got {_type_name(cfg)}")
        return report.problems
    _check_object(report, (), cfg, FUNCTION_CONFIG)
    _semantic_checks(report, cfg, user_config_keys, function_checks, target=target, target_checks=target_checks)
    return report.problems


def _check_target(target: str) -> str:
    if target not in TARGETS:
        raise ConfigError(f"unknown validation target {target!r}; expected one of {', '.join(TARGETS)}")
    return target


def validate_config(
    cfg: Mapping[str, Any],
    path: str,
    user_config_keys: Optional[Mapping[str, Collection[str]]] = None,
    function_checks: Optional[Mapping[str, FunctionCheck]] = None,
    *,
    target: str = CLUSTER,
    target_checks: Optional[Mapping[str, TargetCheck]] = None,
) -> List[str]:
    """Check a loaded function config; return one line per problem, each starting with ``path``.

    ``user_config_keys`` maps a className to the userConfig keys that class reads; for a config
    whose className is in it, any other userConfig key is reported with the valid ones.
    ``function_checks`` maps a className to its own checks (each message becomes a problem), and
    ``target_checks`` to its checks for ``target`` (config/targets.py). For ``cluster`` an empty
    list means ``pulsar-admin functions create`` accepts the config and the checked functions
    start under Pulsar's Python runtime.
    """
    return _validate(cfg, str(path), user_config_keys, {}, function_checks,
                     target=_check_target(target), target_checks=target_checks)


def function_problems(
    cfg: Mapping[str, Any],
    path: str,
    user_config_keys: Mapping[str, Collection[str]],
    function_checks: Mapping[str, FunctionCheck],
) -> List[str]:
    """Only the function class's own problems with a config: unknown userConfig keys and its checks.

    ``localrun`` refuses a config on these (the function would fail or misbehave), while the
    ``functions create`` field checks stay warnings there, as ``pulsar-admin functions localrun``
    accepts e.g. short topic names.
    """
    report = _Report(path=str(path), lines={})
    if isinstance(cfg, Mapping):
        class_name = cfg.get("className") if isinstance(cfg.get("className"), str) else None
        raw = cfg.get("userConfig")
        user_config: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        _check_function(report, cfg, class_name, user_config, user_config_keys, function_checks)
    return report.problems


def _expand(paths: Iterable[Union[str, Path]]) -> List[Union[Path, str]]:
    """Files to validate, in the order given, or a problem line where a path gives none."""
    out: List[Union[Path, str]] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted([*p.glob("*.yaml"), *p.glob("*.yml")])
            if not found:
                out.append(f"{p}: no function config files (*.yaml, *.yml) in this directory")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            out.append(f"{p}: no such file")
    return out


def validate_files(
    paths: Iterable[Union[str, Path]],
    user_config_keys: Optional[Mapping[str, Collection[str]]] = None,
    function_checks: Optional[Mapping[str, FunctionCheck]] = None,
    *,
    target: str = CLUSTER,
    target_checks: Optional[Mapping[str, TargetCheck]] = None,
) -> List[str]:
    """Load and validate function config files (a directory means its *.yaml/*.yml files).

    Returns one line per problem across all files, each starting with the file name (and line
    number where known); an empty list means every file is valid for `target`.
    """
    results = validate_each(paths, user_config_keys, function_checks, target=target, target_checks=target_checks)
    return [line for _name, found in results for line in found]


def validate_each(
    paths: Iterable[Union[str, Path]],
    user_config_keys: Optional[Mapping[str, Collection[str]]] = None,
    function_checks: Optional[Mapping[str, FunctionCheck]] = None,
    *,
    target: str = CLUSTER,
    target_checks: Optional[Mapping[str, TargetCheck]] = None,
) -> List[Tuple[str, List[str]]]:
    """(file, its problems for `target`) for every file the paths name, in order; a bad file never
    hides the rest."""
    _check_target(target)
    results: List[Tuple[str, List[str]]] = []
    for f in _expand(paths):
        if isinstance(f, str):
            results.append((f.split(": ", 1)[0], [f]))
            continue
        try:
            cfg, lines = load_function_config_with_lines(f)
            found = _validate(cfg, str(f), user_config_keys, lines, function_checks,
                              target=target, target_checks=target_checks)
        except FunctionConfigError as exc:
            found = [str(exc)]
        except Exception as exc:  # a checker's own failure is this file's problem, not the others'
            logger.debug("validation of %s failed", f, exc_info=True)
            found = [f"{f}: cannot validate: {type(exc).__name__}: {exc}"]
        logger.debug("validated function config %s: %d problem(s)", f, len(found))
        results.append((str(f), found))
    return results


def system_check(
    paths: Iterable[Union[str, Path]],
    topology_of: Callable[[Mapping[str, Any], str], FunctionTopology],
    parked_on: Sequence[Tuple[str, str]] = (),
    default_parked_on: Sequence[Tuple[str, str]] = (),
) -> List[str]:
    """`validate --system`: do the configs the paths name join up as one system? One line per
    dead end (config/system.py); a file that cannot be read or analysed is one line too.

    `topology_of(config, file name)` describes a config (function_registry.topology_of);
    `parked_on` names delay-level topics producers use, each of which needs a syncer in the set;
    `default_parked_on` too, but only in a set with a syncer (DelayLevelProducer's default).
    """
    functions: List[FunctionTopology] = []
    problems: List[str] = []
    for f in _expand(paths):
        if isinstance(f, str):
            problems.append(f)
            continue
        try:
            cfg, _lines = load_function_config_with_lines(f)
            if not isinstance(cfg, Mapping):
                raise FunctionConfigError(f"{f}: function config must be a mapping of field names")
            functions.append(topology_of(cfg, f.name))
        except FunctionConfigError as exc:
            problems.append(str(exc))
        except (ValueError, TypeError) as exc:  # the per-file checks name the key; here: what is not analysed
            problems.append(f"{f}: cannot tell what it reads and writes: {exc}")
    return problems + system_problems(functions, parked_on, default_parked_on)
