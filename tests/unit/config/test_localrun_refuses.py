"""`pulsar-lifecycle localrun` refuses a config its function would reject or misrun, before starting anything."""
from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from pulsar_lifecycle.cli.function_registry import FUNCTION_CHECKS, USER_CONFIG_KEYS
from pulsar_lifecycle.cli.main import main
from pulsar_lifecycle.config.validate import function_problems, validate_config

SHIPPED = Path(__file__).resolve().parents[3] / "function-configs" / "bucket-snapshot-writer.yaml"


def _run(tmp_path: Path, cfg: dict, *args: str) -> "object":
    path = tmp_path / "f.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # A refusal must come before the embedded broker starts: --broker-service-url points nowhere
    # reachable, so getting past the check would fail differently (cannot start ...).
    return CliRunner().invoke(main, ["localrun", "--function-config-file", str(path), "--data-dir",
                                     str(tmp_path / "data"), "--broker-service-url", "pulsar://127.0.0.1:1",
                                     "--run-seconds", "0", *args])


def test_unknown_user_config_key_is_refused_with_the_valid_ones(tmp_path: Path) -> None:
    cfg = yaml.safe_load(SHIPPED.read_text())
    cfg["userConfig"]["tickTimeMilis"] = 500
    result = _run(tmp_path, cfg)
    assert result.exit_code == 1
    assert "userConfig key 'tickTimeMilis' is not read" in result.output
    assert "did you mean 'tickTimeMillis'" in result.output
    assert "nothing started" in result.output
    assert not (tmp_path / "data").exists()


def test_parallelism_flag_is_checked_with_the_config(tmp_path: Path) -> None:
    cfg = yaml.safe_load(SHIPPED.read_text())
    cfg["userConfig"]["schedulingTopicPartitions"] = 4
    cfg["inputSpecs"] = {"persistent://public/default/delayed-ticks": {}}
    result = _run(tmp_path, cfg, "--parallelism", "2")
    assert result.exit_code == 1
    assert "receiverQueueSize: 1" in result.output


def test_short_topic_names_stay_accepted_like_pulsar_admin_localrun() -> None:
    cfg = {"className": "example_function.ExampleFunction", "inputs": ["in"], "output": "out"}
    # `validate` reports the short names (functions create needs them qualified); localrun does not.
    assert validate_config(cfg, "f.yaml", USER_CONFIG_KEYS, FUNCTION_CHECKS)
    assert function_problems(cfg, "f.yaml", USER_CONFIG_KEYS, FUNCTION_CHECKS) == []
