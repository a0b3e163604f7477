"""Real Pulsar's set-up errors are one line that says what to do (runtime/pulsar_release.py)."""
from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from pulsar_lifecycle.runtime import pulsar_standalone
from pulsar_lifecycle.runtime.pulsar_release import PulsarSetupError, java_executable, resolve
from pulsar_lifecycle.runtime.pulsar_standalone import PulsarStandalone


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def test_missing_java_says_to_install_one(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java here
    with pytest.raises(PulsarSetupError) as err:
        java_executable()
    assert "install" in _one_line(err.value) and "JAVA_HOME" in str(err.value)


def test_old_java_is_refused_with_its_version(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "java", 'echo \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PulsarSetupError) as err:
        java_executable()
    assert "Java 11" in _one_line(err.value) and "17" in str(err.value)


def test_missing_maven_on_a_cold_cache_says_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_LIFECYCLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn
    with pytest.raises(PulsarSetupError) as err:
        resolve("4.0.0", progress=False)
    assert "apt-get install maven" in _one_line(err.value)


def test_unresolvable_artifact_names_it(tmp_path, monkeypatch):
    # A stand-in for mvn that fails the way Maven does when Central lacks a jar.
    _fake_tool(tmp_path, "mvn", 'echo "[ERROR] Failed to execute goal on project x: Could not resolve dependencies '
               'for project x: Could not find artifact org.apache.pulsar:pulsar-broker:jar:0.0.1 in central -> [Help 1]"\n'
               "exit 1\n")
    monkeypatch.setenv("PULSAR_LIFECYCLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PulsarSetupError) as err:
        resolve("0.0.1", progress=False)
    line = _one_line(err.value)
    assert "org.apache.pulsar:pulsar-broker:jar:0.0.1" in line and "PULSAR_LIFECYCLE_PULSAR_VERSION" in line
    assert (tmp_path / "cache" / "pulsar-0.0.1" / "maven.log").is_file()


def test_a_port_in_use_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(pulsar_standalone, "resolve", lambda *a, **k: pytest.fail("resolved despite the busy port"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        p = PulsarStandalone(data_dir=tmp_path, broker_port=port)
        with pytest.raises(PulsarSetupError) as err:
            p.start()
    assert f"127.0.0.1:{port}" in _one_line(err.value) and "in use" in str(err.value)
