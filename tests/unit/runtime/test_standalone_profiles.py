"""The standalone's JVM and cache profiles (runtime/pulsar_standalone.py PROFILES): "small" for tests,
"defaults" as Pulsar 4.0's pulsar_env.sh and standalone.conf give them."""
from __future__ import annotations

import pytest

from pulsar_lifecycle.runtime.pulsar_release import PulsarSetupError
from pulsar_lifecycle.runtime.pulsar_standalone import PROFILES, PulsarStandalone


def _conf(tmp_path, **kw) -> dict:
    s = PulsarStandalone(data_dir=tmp_path, **kw)
    s.ports = {"broker": 1, "web": 2, "zookeeper": 3, "bookie": 4, "bookie_http": 5, "stream": 6}
    return dict(line.split("=", 1) for line in s._standalone_conf().splitlines())


def test_small_is_the_default_with_small_bookie_caches(tmp_path):
    conf = _conf(tmp_path)
    assert PulsarStandalone().profile == "small"
    assert conf["dbStorage_writeCacheMaxSizeMb"] == "32" and conf["dbStorage_readAheadCacheMaxSizeMb"] == "32"
    assert "-Xmx1g" in PROFILES["small"]


def test_defaults_are_pulsars_own(tmp_path):
    conf = _conf(tmp_path, profile="defaults")
    # the bookie's caches are left to standalone.conf's defaults (sized from the direct memory)
    assert not any(k.startswith("dbStorage_") for k in conf)
    jvm = PROFILES["defaults"]
    assert {"-Xms2g", "-Xmx2g", "-XX:MaxDirectMemorySize=4g", "-XX:+UseZGC"} <= set(jvm)
    assert not any("G1" in opt for opt in jvm)


def test_unknown_profile_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(PulsarSetupError, match="unknown standalone profile 'huge'.*defaults.*small"):
        _conf(tmp_path, profile="huge")
