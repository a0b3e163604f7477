"""Which BookKeeper table service keeps this function's state, as the runtime running it knows it.

Pulsar's Python Context has no call that names the table service. The worker hands it to each
Python instance it starts as the argument `--state_storage_serviceurl bk://host:4181`
(`RuntimeUtils.getCmd`: the worker's `stateStorageServiceUrl`, or `pulsar-admin functions localrun
--state-storage-service-url`); the instance opens its state context on it and keeps that in
`ContextImpl.state_context`. `function_state_service` reads it from the first of these places
that has it:

1. this package's local run mode: the context's state store (`context.state`; its BookKeeper
   backend has `url`, the directory backend none);
2. the runtime's state context (`context.state_context`): Pulsar's `BKManagedStateContext`
   keeps its `bookkeeper.kv.Client` as `__client__`, whose `storage_client_settings.service_uri`
   is the URL the instance's state uses; its `NullStateContext` means the instance has no state;
3. the instance process's command line (`sys.argv`): `--state_storage_serviceurl URL` or
   `--state_storage_serviceurl=URL`, as `python_instance_main.py` parses it;
4. the instance's `--config_file`: newer instances take arguments missing from the command line
   from its `[DEFAULT]` section (`merge_arguments`).

Places 2-4 are the runtime's internals, not an API; reading each one is guarded, and a runtime
that changes them makes the lookup find nothing, never fail. The caller then names the
userConfig key that makes the lookup unnecessary.
"""
from __future__ import annotations

import configparser
import logging
import sys
from dataclasses import dataclass
from typing import Any, Optional, Sequence

log = logging.getLogger(__name__)

#: The argument the worker passes the table service to a Python instance with.
STATE_URL_ARG = "--state_storage_serviceurl"
_CONFIG_FILE_ARG = "--config_file"
_NULL_STATE_CONTEXTS = ("NullStateContext",)


@dataclass(frozen=True)
class StateService:
    """The table service of the function's state (`url`, None when there is none) and where
    that was learnt (`source`, for logs and errors)."""

    url: Optional[str]
    source: str


def function_state_service(context: Any, argv: Optional[Sequence[str]] = None) -> StateService:
    """The BookKeeper table service keeping `context`'s function state, or url None.

    Args:
        context: the Context the runtime passed to process().
        argv: the instance process's command line; default `sys.argv`.
    """
    local_state = getattr(context, "state", None)
    if local_state is not None and hasattr(context, "data_dir"):
        url = _text(getattr(local_state, "url", None))
        return StateService(url, "localrun --state-storage-service-url" if url else
                            "localrun without --state-storage-service-url (directory state store)")
    runtime_state = getattr(context, "state_context", None)
    url = _from_state_context(runtime_state)
    if url:
        return StateService(url, "the runtime's state context")
    args = list(sys.argv if argv is None else argv)
    url = _argument(args, STATE_URL_ARG)
    if url:
        return StateService(url, f"the instance's {STATE_URL_ARG} argument")
    config_file = _argument(args, _CONFIG_FILE_ARG)
    url = _from_config_file(config_file) if config_file else None
    if url:
        return StateService(url, f"state_storage_serviceurl in the instance's {_CONFIG_FILE_ARG} {config_file}")
    if runtime_state is not None and type(runtime_state).__name__ in _NULL_STATE_CONTEXTS:
        return StateService(None, f"the runtime's state context is a {type(runtime_state).__name__} "
                                  f"(the instance got no {STATE_URL_ARG}: its worker has no stateStorageServiceUrl)")
    return StateService(None, f"no {STATE_URL_ARG} in the instance's arguments and no BookKeeper state context")


def _text(value: Any) -> Optional[str]:
    return value.strip() if isinstance(value, str) and value.strip() else None


def _from_state_context(state_context: Any) -> Optional[str]:
    # `__client__` has trailing underscores too, so Python does not mangle the name.
    client = getattr(state_context, "__client__", None)
    settings = getattr(client, "storage_client_settings", None)
    return _text(getattr(settings, "service_uri", None))


def _argument(argv: Sequence[str], name: str) -> Optional[str]:
    """The value of `name` as argparse reads it (`name value` or `name=value`; the last one wins)."""
    value: Optional[str] = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg[len(name) + 1:]
    return _text(value)


def _from_config_file(path: str) -> Optional[str]:
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except (OSError, configparser.Error) as exc:
        # An unreadable config file only means this place has no answer.
        log.debug("event=state_config_file_unreadable path=%s error=%r", path, exc)
        return None
    return _text(parser.defaults().get("state_storage_serviceurl"))
