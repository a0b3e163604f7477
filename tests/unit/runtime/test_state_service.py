"""function_state_service: the table service of a function's state, read from each place a runtime keeps it."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pulsar_lifecycle.runtime.state_service import STATE_URL_ARG, function_state_service

URL = "bk://bookie-1:4181"


class BKManagedStateContext:
    """The shape of Pulsar's BookKeeper state context: its kv client kept as `__client__`."""

    def __init__(self, url: str) -> None:
        self.__client__ = SimpleNamespace(storage_client_settings=SimpleNamespace(service_uri=url))


class NullStateContext:
    """Pulsar's state context of an instance without --state_storage_serviceurl."""


def _runtime_context(state_context: Any) -> Any:
    return SimpleNamespace(state_context=state_context)


def test_pulsars_bookkeeper_state_context_names_the_url() -> None:
    found = function_state_service(_runtime_context(BKManagedStateContext(URL)), argv=["python_instance_main.py"])
    assert found.url == URL and "state context" in found.source


def test_the_instance_argument_names_it_in_both_argparse_forms() -> None:
    for argv in (["main.py", "--instance_id", "0", STATE_URL_ARG, URL, "--cluster_name", "c"],
                 ["main.py", f"{STATE_URL_ARG}={URL}"]):
        found = function_state_service(_runtime_context(object()), argv=argv)
        assert found.url == URL and STATE_URL_ARG in found.source, argv


def test_the_instances_config_file_names_it(tmp_path: Path) -> None:
    conf = tmp_path / "instance.conf"
    conf.write_text(f"[DEFAULT]\nstate_storage_serviceurl = {URL}\ncluster_name = c\n")
    found = function_state_service(_runtime_context(None), argv=["main.py", "--config_file", str(conf)])
    assert found.url == URL and str(conf) in found.source


def test_no_state_says_why() -> None:
    found = function_state_service(_runtime_context(NullStateContext()), argv=["main.py", "--instance_id", "0"])
    assert found.url is None and "NullStateContext" in found.source and STATE_URL_ARG in found.source
    found = function_state_service(SimpleNamespace(), argv=["main.py"])
    assert found.url is None and STATE_URL_ARG in found.source


def test_internals_of_another_shape_find_nothing_instead_of_failing(tmp_path: Path) -> None:
    odd = SimpleNamespace(__client__=SimpleNamespace(storage_client_settings=None))
    found = function_state_service(_runtime_context(odd),
                                   argv=["main.py", STATE_URL_ARG, "", "--config_file", str(tmp_path / "missing")])
    assert found.url is None


def test_local_run_mode_reads_its_own_state_store() -> None:
    with_bk = SimpleNamespace(state=SimpleNamespace(url=URL), data_dir=Path("/tmp/d"))
    assert function_state_service(with_bk, argv=[]).url == URL
    directory = SimpleNamespace(state=SimpleNamespace(path=Path("/tmp/d/state")), data_dir=Path("/tmp/d"))
    found = function_state_service(directory, argv=["pulsar-lifecycle", STATE_URL_ARG, URL])
    assert found.url is None and "directory state store" in found.source
