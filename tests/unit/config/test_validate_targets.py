"""`pulsar-lifecycle validate --target cluster|localrun`: every shipped config and every config
block of the docs passes for both; what would fail under Pulsar's runtime is refused for a
cluster, naming the userConfig key to set."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml
from click.testing import CliRunner

from pulsar_lifecycle.cli.function_registry import FUNCTION_CHECKS, TARGET_CHECKS, USER_CONFIG_KEYS
from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.config.exceptions import ConfigError
from pulsar_lifecycle.config.targets import TARGETS
from pulsar_lifecycle.config.validate import validate_config
from support.docs_blocks import config_of, doc_blocks
from support.paths import REPO

SHIPPED = sorted([*(REPO / "function-configs").glob("*.yaml"), *(REPO / "function-configs" / "alternatives").glob("*.yaml")])
YAML_BLOCKS = doc_blocks("yaml")
WRITER = REPO / "function-configs" / "bucket-snapshot-writer.yaml"


def _validate(*args: str) -> Any:
    return CliRunner().invoke(main, ["validate", *args], catch_exceptions=False)


def _write(tmp_path: Path, cfg: Dict[str, Any], name: str = "fn.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _writer(**user: Any) -> Dict[str, Any]:
    cfg = yaml.safe_load(WRITER.read_text())
    cfg["userConfig"] = dict(cfg["userConfig"], **user)
    return cfg


def _problems(cfg: Dict[str, Any], target: str) -> List[str]:
    return validate_config(cfg, "fn.yaml", USER_CONFIG_KEYS, FUNCTION_CHECKS, target=target, target_checks=TARGET_CHECKS)


@pytest.mark.parametrize("target", TARGETS)
def test_every_shipped_config_passes_validate_for_both_targets(target: str) -> None:
    res = _validate("--target", target, *[str(p) for p in SHIPPED])
    assert res.exit_code == 0, res.output
    assert f"OK: {len(SHIPPED)} file(s) checked for {target}" in res.output


def test_the_docs_have_config_blocks() -> None:
    assert YAML_BLOCKS, "no ```yaml block in docs/*.md or README.md"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("block", YAML_BLOCKS, ids=[b.where for b in YAML_BLOCKS])
def test_every_config_block_of_the_docs_passes_validate(block: Any, target: str, tmp_path: Path) -> None:
    """A block abridging a shipped config (`# function-configs/x.yaml (abridged)`) is laid over it."""
    path = _write(tmp_path, config_of(block), "block.yaml")
    res = _validate("--target", target, str(path))
    assert res.exit_code == 0, f"{block.where}:\n{block.text}\n{res.output}"


def test_the_writer_config_before_auto_is_refused_for_a_cluster_naming_snapshot_dir(tmp_path: Path) -> None:
    """The writer config as shipped before `auto` (snapshotStorage: directory, no snapshotDir)
    fails at its first message under Pulsar's runtime; localrun has a directory for it."""
    path = _write(tmp_path, _writer(snapshotStorage="directory"), "bucket-snapshot-writer.yaml")
    res = _validate(str(path))
    assert res.exit_code == 1
    lines = [line for line in res.output.splitlines() if "snapshotStorage: directory" in line]
    assert len(lines) == 1, res.output
    assert "(cluster)" in lines[0] and "set userConfig snapshotDir" in lines[0], lines[0]
    assert lines[0].startswith(f"{path}:"), "the line points at the file (and the key's line)"
    assert _validate("--target", "localrun", str(path)).exit_code == 0


def test_a_relative_snapshot_dir_is_refused_for_a_cluster(tmp_path: Path) -> None:
    problems = _problems(_writer(snapshotDir="buckets/writer"), "cluster")
    assert len(problems) == 1 and "relative" in problems[0] and "snapshotDir" in problems[0], problems
    assert _problems(_writer(snapshotDir="buckets/writer"), "localrun") == []
    assert _problems(_writer(snapshotDir="/mnt/shared/writer"), "cluster") == []
    assert _problems(_writer(snapshotStorageServiceUrl="bk://bookie-1:4181"), "cluster") == []


def test_auto_with_both_a_directory_and_a_table_service_is_refused_everywhere() -> None:
    for target in TARGETS:
        problems = _problems(_writer(snapshotDir="/mnt/w", snapshotStorageServiceUrl="bk://b:4181"), target)
        assert any("set snapshotStorage to directory or bookkeeper" in p for p in problems), problems


def test_localrun_leaves_out_the_functions_create_checks() -> None:
    base = {"className": "example_function.ExampleFunction", "inputs": ["example-input"],
            "output": "persistent://public/default/out", "processingGuarantees": "EFFECTIVELY_ONCE"}
    cluster = _problems(base, "cluster")
    assert any("EFFECTIVELY_ONCE" in p for p in cluster) and any("not fully qualified" in p for p in cluster), cluster
    assert _problems(base, "localrun") == []
    # What the Python client refuses at subscribe fails on both.
    for target in TARGETS:
        assert any("timeoutMs" in p for p in _problems(dict(base, timeoutMs=5000), target))


def test_an_unknown_target_is_refused() -> None:
    res = CliRunner().invoke(main, ["validate", "--target", "k8s", str(WRITER)])
    assert res.exit_code == 2 and "k8s" in res.output
    with pytest.raises(ConfigError, match="unknown validation target"):
        validate_config({}, "fn.yaml", target="k8s")
