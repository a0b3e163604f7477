"""snapshot_location: where the writer's bucket index lives, per runtime (userConfig snapshotStorage)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import pytest

from pulsar_lifecycle.config.settings import ConfigError
from pulsar_lifecycle.scheduler.config import WriterConfig
from pulsar_lifecycle.scheduler.snapshot_location import (
    BOOKKEEPER,
    DIRECTORY,
    SnapshotLocationError,
    location_problems,
    snapshot_location,
)

URL = "bk://bookie-1:4181"


def _context(data_dir: Optional[Path] = None, state_context: Any = None, instance: str = "0") -> Any:
    ctx = SimpleNamespace(get_function_tenant=lambda: "public", get_function_namespace=lambda: "default",
                          get_function_name=lambda: "bucket-snapshot-writer", get_instance_id=lambda: instance,
                          state_context=state_context)
    if data_dir is not None:
        ctx.data_dir = data_dir
        ctx.state = SimpleNamespace(path=data_dir / "state")
    return ctx


def _bk_state(url: str) -> Any:
    state = SimpleNamespace()
    state.__client__ = SimpleNamespace(storage_client_settings=SimpleNamespace(service_uri=url))
    return state


class NullStateContext:
    """Pulsar's state context of an instance without function state."""


def test_auto_is_the_default() -> None:
    assert WriterConfig().snapshot_storage == "auto"


def test_auto_under_pulsars_runtime_is_the_function_states_table_service() -> None:
    where = snapshot_location(WriterConfig(), _context(state_context=_bk_state(URL)), argv=["main.py"])
    assert (where.storage, where.url) == (BOOKKEEPER, URL) and "function state" in where.reason


def test_auto_under_pulsars_runtime_reads_the_instance_argument_too() -> None:
    where = snapshot_location(WriterConfig(), _context(state_context=object()),
                              argv=["main.py", "--state_storage_serviceurl", URL])
    assert (where.storage, where.url) == (BOOKKEEPER, URL)


def test_auto_without_function_state_names_both_keys() -> None:
    with pytest.raises(SnapshotLocationError) as info:
        snapshot_location(WriterConfig(), _context(state_context=NullStateContext()), argv=["main.py"])
    message = str(info.value)
    assert "snapshotStorageServiceUrl" in message and "snapshotDir" in message and "NullStateContext" in message
    assert isinstance(info.value, ConfigError)


def test_auto_under_localrun_is_the_data_dir_even_with_a_table_service(tmp_path: Path) -> None:
    ctx = _context(data_dir=tmp_path)
    ctx.state = SimpleNamespace(url=URL)  # localrun --state-storage-service-url
    where = snapshot_location(WriterConfig(), ctx)
    assert (where.storage, where.path) == (DIRECTORY, tmp_path / "buckets" / "public_default_bucket_snapshot_writer")
    second = snapshot_location(WriterConfig(), _context(data_dir=tmp_path, instance="1"))
    assert second.path == tmp_path / "buckets" / "public_default_bucket_snapshot_writer-instance-1"
    shared = snapshot_location(WriterConfig(), _context(data_dir=tmp_path, instance="1"), per_instance=False)
    assert shared.path == tmp_path / "buckets" / "public_default_bucket_snapshot_writer"


def test_a_set_key_picks_the_place_on_every_runtime(tmp_path: Path) -> None:
    for ctx in (_context(state_context=_bk_state(URL)), _context(data_dir=tmp_path)):
        by_dir = snapshot_location(WriterConfig(snapshot_dir="/mnt/w"), ctx, argv=[])
        assert (by_dir.storage, by_dir.path) == (DIRECTORY, Path("/mnt/w"))
        by_url = snapshot_location(WriterConfig(snapshot_storage_service_url="bk://other:4181"), ctx, argv=[])
        assert (by_url.storage, by_url.url) == (BOOKKEEPER, "bk://other:4181")


def test_directory_without_snapshot_dir_under_pulsars_runtime_names_snapshot_dir() -> None:
    with pytest.raises(SnapshotLocationError, match="needs snapshotDir under Pulsar's runtime"):
        snapshot_location(WriterConfig(snapshot_storage="directory"), _context(state_context=_bk_state(URL)), argv=[])


def test_config_values_are_checked_when_built() -> None:
    with pytest.raises(ConfigError, match="both set"):
        WriterConfig(snapshot_dir="/mnt/w", snapshot_storage_service_url=URL)
    with pytest.raises(ConfigError, match="bk://host:port"):
        WriterConfig(snapshot_storage_service_url="http://bookie:4181")
    with pytest.raises(ConfigError, match="needs snapshotStorageServiceUrl"):
        WriterConfig(snapshot_storage="bookkeeper")
    assert WriterConfig(snapshot_storage="directory", snapshot_dir="/mnt/w",
                        snapshot_storage_service_url=URL).snapshot_storage == "directory"


def test_location_problems_per_target() -> None:
    assert location_problems({}, "cluster") == []
    assert location_problems({"snapshotStorage": "bookkeeper", "snapshotStorageServiceUrl": URL}, "cluster") == []
    refused = location_problems({"snapshotStorage": "directory"}, "cluster")
    assert len(refused) == 1 and refused[0].startswith("userConfig snapshotStorage: directory")
    assert location_problems({"snapshotStorage": "directory"}, "localrun") == []
    assert location_problems({"snapshotStorage": 5}, "cluster") == []  # a bad value: the value check reports it
