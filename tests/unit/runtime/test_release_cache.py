"""The Maven artifact cache (runtime/pulsar_release): a classpath resolved from another POM than
the one this version writes is not used (the local runner's pins: log4j-api, protobuf-java)."""
from __future__ import annotations

from pathlib import Path

from pulsar_lifecycle.runtime import pulsar_release


def _cache(home: Path, pom: str) -> Path:
    home.mkdir()
    jar = home / "a.jar"
    jar.write_bytes(b"")
    (home / "classpath.txt").write_text(str(jar))
    (home / "pom.xml").write_text(pom)
    return jar


def test_a_classpath_from_the_same_pom_is_used(tmp_path: Path) -> None:
    jar = _cache(tmp_path / "set", "<project>1</project>")
    assert pulsar_release._cached(tmp_path / "set", "<project>1</project>") == [str(jar)]


def test_a_classpath_from_another_pom_is_resolved_again(tmp_path: Path) -> None:
    _cache(tmp_path / "set", "<project>without the pins</project>")
    assert pulsar_release._cached(tmp_path / "set", "<project>with the pins</project>") is None


def test_the_local_runner_pins_log4j_api_and_protobuf_java() -> None:
    pins = pulsar_release.LOCAL_RUNNER_PINS.format(log4j=pulsar_release.LOG4J_VERSION,
                                                   protobuf=pulsar_release.LOCAL_RUNNER_PROTOBUF)
    assert f"<artifactId>log4j-api</artifactId><version>{pulsar_release.LOG4J_VERSION}</version>" in pins
    assert "<artifactId>protobuf-java</artifactId><version>3.25.8</version>" in pins
