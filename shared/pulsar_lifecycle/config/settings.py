"""One way to declare a function's userConfig: `setting()` fields on a frozen dataclass.

Each field carries its userConfig key, default, meaning and bounds in its metadata; the converters
below are the only place a userConfig value is turned into a Python value, so every function gives
the same answer for the same value (docs/configuration.md, "Value rules"):

* integer: 5, "5", 5.0, "5.0" and " 5 " -> 5 (Pulsar's `--user-config` JSON goes through Gson,
  which turns 5 into 5.0); 5.7, "5.7", "x", true and "" are refused.
* boolean: true/false and the strings "true"/"false" in any case; 1, "yes", "on" are refused.
* string: a string only (a YAML number or list is refused, not turned into text).
* list of strings: a list of strings or one comma-separated string (blank items dropped).
* None (a YAML key with no value) means "not given": the default applies.

Every refusal is a ConfigError naming the userConfig key and the value. `parse_settings` also
refuses unknown keys, naming the key and listing the valid ones. Bounds (`minimum`, `maximum`,
`choices`, `also` for special values such as -1) are checked in `check_settings`, which a config
class calls from `__post_init__`, so a config built in code is checked the same way.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, TypeVar

from .exceptions import ConfigError

__all__ = [
    "ConfigError", "Setting", "check_settings", "defaults_of", "parse_settings", "read_setting", "setting", "settings_of", "to_bool",
    "to_int", "to_str", "to_str_list", "unknown_key_error", "user_config_from_json", "user_config_keys",
]

T = TypeVar("T")
Converter = Callable[[str, Any], Any]


def _refuse(key: str, value: Any, what: str) -> ConfigError:
    return ConfigError(f"userConfig {key} must be {what}, got {value!r}")


def to_int(key: str, value: Any) -> int:
    """5, "5", 5.0, "5.0" -> 5; 5.7, "x", booleans and anything else -> ConfigError naming `key`."""
    if isinstance(value, bool):
        raise _refuse(key, value, "an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if value.is_integer():
            return int(value)
        raise _refuse(key, value, "an integer")
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = float(text)
        except ValueError:
            raise _refuse(key, value, "an integer") from None
        if number.is_integer():
            return int(number)
    raise _refuse(key, value, "an integer")


def to_bool(key: str, value: Any) -> bool:
    """true/false, "true"/"false" (any case) -> bool; anything else -> ConfigError naming `key`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _refuse(key, value, "true or false")


def to_str(key: str, value: Any) -> str:
    """A string as given; anything else (a number, a list) -> ConfigError naming `key`."""
    if isinstance(value, str):
        return value
    raise _refuse(key, value, "a string")


def to_str_list(key: str, value: Any) -> Tuple[str, ...]:
    """A list of strings or one comma-separated string -> tuple of the non-blank stripped items."""
    if isinstance(value, str):
        items: Iterable[Any] = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise _refuse(key, value, "a string or a list of strings")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise _refuse(key, value, "a string or a list of strings")
        if item.strip():
            out.append(item.strip())
    return tuple(out)


def user_config_from_json(text: str) -> Dict[str, Any]:
    """The `--user-config '{json}'` of the CLI commands: a JSON object, else a ConfigError."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--user-config is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"--user-config must be a JSON object, got {type(value).__name__}")
    return value


def read_setting(user_config: Optional[Mapping[str, Any]], key: str, convert: Converter, default: Any) -> Any:
    """One key of a userConfig map through a converter, for a reader outside the config classes
    (the local runner's ticker); a missing or None value gives `default`."""
    value = (user_config or {}).get(key)
    return default if value is None else convert(key, value)


_CONVERTERS: Dict[type, Converter] = {bool: to_bool, int: to_int, str: to_str, tuple: to_str_list}


@dataclass(frozen=True)
class Setting:
    """What a config field declares about its userConfig key (kept in the field's metadata)."""

    key: str
    meaning: str
    convert: Converter
    minimum: Optional[int] = None
    maximum: Optional[int] = None
    choices: Tuple[str, ...] = ()
    also: Tuple[Any, ...] = ()  # values allowed outside the bounds, e.g. -1 = unlimited

    def check(self, value: Any) -> Any:
        """`value` converted and bounds-checked; a ConfigError names the key and the value."""
        if value is None:
            return None
        value = self.convert(self.key, value)
        if value in self.also and not isinstance(value, bool):
            return value
        extra = "".join(f" or {v!r}" for v in self.also)
        if self.minimum is not None and value < self.minimum:
            raise _refuse(self.key, value, f">= {self.minimum}{extra}")
        if self.maximum is not None and value > self.maximum:
            raise _refuse(self.key, value, f"<= {self.maximum}{extra}")
        if self.choices and value not in self.choices:
            raise _refuse(self.key, value, "one of " + ", ".join(repr(c) for c in self.choices))
        return value


def setting(key: str, default: Any, meaning: str, *, minimum: Optional[int] = None,
            maximum: Optional[int] = None, choices: Sequence[str] = (), also: Sequence[Any] = (),
            convert: Optional[Converter] = None) -> Any:
    """A dataclass field read from userConfig `key` (default `default`, documented as `meaning`).

    The converter follows the default's type (bool, int, str, tuple = list of strings); pass
    `convert` when the default is None. The return value is a `dataclasses.field`.
    """
    if convert is None:
        kind = next((k for k in _CONVERTERS if isinstance(default, k)), None)
        if kind is None:
            raise TypeError(f"setting {key!r}: no converter for a default of {default!r}; pass convert=")
        convert = _CONVERTERS[kind]
    spec = Setting(key=key, meaning=meaning, convert=convert, minimum=minimum, maximum=maximum,
                   choices=tuple(choices), also=tuple(also))
    return dataclasses.field(default=default, metadata={"setting": spec})


def settings_of(cls: type) -> Dict[str, Tuple[dataclasses.Field, Setting]]:
    """userConfig key -> (dataclass field, Setting) of `cls`, in declaration order."""
    return {f.metadata["setting"].key: (f, f.metadata["setting"])
            for f in dataclasses.fields(cls) if "setting" in f.metadata}


def defaults_of(cls: type) -> Dict[str, Any]:
    """userConfig key -> default of `cls` (for a CLI option that mirrors a key)."""
    return {key: f.default for key, (f, _spec) in settings_of(cls).items()}


def user_config_keys(*classes: type) -> List[str]:
    """Every userConfig key the given config classes read, sorted."""
    return sorted(key for cls in classes for key in settings_of(cls))


def check_settings(obj: Any) -> None:
    """Convert and bounds-check every setting field of a (frozen) config instance, in place.

    Called from `__post_init__`: a config built in code (`BucketConfig(max_unacked_per_bucket=0)`)
    is refused with the same message as the same value in userConfig.
    """
    for _key, (f, spec) in settings_of(type(obj)).items():
        object.__setattr__(obj, f.name, spec.check(getattr(obj, f.name)))


def unknown_key_error(key: str, function: str, valid: Sequence[str]) -> ConfigError:
    """The error for a userConfig key no config class of `function` reads."""
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown userConfig key {key!r} for {function}{hint}; valid keys: {sorted(valid)}")


def parse_settings(cls: Type[T], user_config: Optional[Mapping[str, Any]], *, function: str,
                   also_known: Sequence[str] = (), extra: Optional[Mapping[str, Any]] = None) -> T:
    """Build `cls` from a userConfig map: known keys converted, unknown ones refused.

    `also_known` are keys another config class of the same function reads (skipped here, not
    refused); `extra` are constructor arguments that are not settings (names, nested configs).
    None values mean "not given" (the default applies).
    """
    known = settings_of(cls)
    kwargs: Dict[str, Any] = dict(extra or {})
    for key, value in (user_config or {}).items():
        if key in known:
            if value is not None:
                kwargs[known[key][0].name] = known[key][1].check(value)
        elif key not in also_known:
            raise unknown_key_error(str(key), function, list(known) + list(also_known))
    return cls(**kwargs)  # type: ignore[call-arg]


def describe_default(value: Any) -> str:
    """A default as the docs show it."""
    if value in ("", None, ()):
        return "(empty)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return f"`{','.join(value)}`"
    return f"`{value}`"


def describe_bounds(spec: Setting) -> str:
    """The bounds of a setting as the docs show them."""
    parts = []
    if spec.choices:
        parts.append("one of " + ", ".join(f"`{c}`" for c in spec.choices))
    if spec.minimum is not None:
        parts.append(f">= {spec.minimum}")
    if spec.maximum is not None:
        parts.append(f"<= {spec.maximum}")
    parts += [f"or `{v}`" for v in spec.also]
    names: Dict[Converter, str] = {to_int: "integer", to_bool: "boolean", to_str: "string",
                                   to_str_list: "list of strings"}
    kind = names.get(spec.convert, "string")
    return kind + (", " + " ".join(parts) if parts else "")


def settings_table(*classes: type) -> str:
    """The Markdown userConfig table of the given config classes (docs/configuration.md)."""
    rows = ["| key | default | values | meaning |", "|---|---|---|---|"]
    for cls in classes:
        for key, (f, spec) in settings_of(cls).items():
            default = f.default if f.default is not dataclasses.MISSING else None
            rows.append(f"| `{key}` | {describe_default(default)} | {describe_bounds(spec)} | {spec.meaning} |")
    return "\n".join(rows)
