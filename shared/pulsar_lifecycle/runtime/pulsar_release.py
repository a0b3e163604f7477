"""Resolving a pinned Apache Pulsar release from Maven Central into a per-machine cache.

Real Pulsar here is the `pulsar-broker` artifact and its runtime dependencies (BookKeeper, its
table service, ZooKeeper, the admin REST API), resolved by Maven from Maven Central only and
run from the jars (runtime/pulsar_standalone.py). No tarball from anywhere else is used.

The cache lives outside the repository: `$PULSAR_LIFECYCLE_CACHE` or
`~/.cache/pulsar-lifecycle`, one folder per release holding the POM we resolve, a Maven settings
file that sends every repository to Maven Central (the release's POMs also name Confluent's
repository, which need not be reachable), Maven's local repository and the resolved classpath.
It is resolved once per machine; a lock file makes parallel first runs wait for each other.

Why 4.0.0: it is the 4.0 LTS line, and of the 4.0.x releases Maven Central serves here it is the
one whose whole dependency set resolves (4.0.1-4.0.8 lack `jetcd-core-shaded` or
`pulsar-opentelemetry` jars there). 4.2.4 resolves too, but without the binary distribution's
pinned versions its OpenTelemetry jars disagree and the broker fails at start-up
(NoSuchMethodError in `Ordered.loadOrderedList`). `$PULSAR_LIFECYCLE_PULSAR_VERSION` picks another.
"""
from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from ..exceptions import PulsarLifecycleError

log = logging.getLogger(__name__)

PULSAR_VERSION = "4.0.0"
LOG4J_VERSION = "2.24.3"  # the broker's jars log through slf4j; log4j writes our own log file
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
MIN_JAVA = 17
# `pulsar-admin` (the tests' `functions create`): 4.0.0's pulsar-client-tools is not on Maven
# Central, 4.0.8 is and speaks the 4.0 admin API; Jackson pinned to its BOM's version.
CLIENT_TOOLS_VERSION = "4.0.8"
CLIENT_TOOLS_JACKSON = "2.17.2"


class PulsarSetupError(PulsarLifecycleError, RuntimeError):
    """Real Pulsar cannot be resolved or started here; the message says what to do."""


def cache_root() -> Path:
    """Where releases are resolved to (outside the repository)."""
    env = os.environ.get("PULSAR_LIFECYCLE_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pulsar-lifecycle"


def pinned_version() -> str:
    """The Apache Pulsar release the tests, benchmarks and demo run."""
    return os.environ.get("PULSAR_LIFECYCLE_PULSAR_VERSION") or PULSAR_VERSION


def java_executable() -> str:
    """`java` of JAVA_HOME or PATH, checked to be Java 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").is_file() else shutil.which("java")
    if not java:
        raise PulsarSetupError("real Pulsar needs Java 17+, and no `java` is on PATH: install one "
                               "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PulsarSetupError(f"`{java} -version` failed ({exc}): install Java 17+ or set JAVA_HOME") from exc
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):
        major = int(m.group(2))
    if major < MIN_JAVA:
        raise PulsarSetupError(f"real Pulsar needs Java {MIN_JAVA}+, {java} is Java {major or '?'}: "
                               "install openjdk-17-jre-headless or set JAVA_HOME to a newer JDK")
    return java


@dataclass(frozen=True)
class PulsarRelease:
    """One resolved release: its version and the jars of its classpath."""

    version: str
    home: Path
    classpath: List[str]

    @property
    def classpath_arg(self) -> str:
        """The classpath as `java -cp` takes it."""
        return os.pathsep.join(self.classpath)


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pulsar-lifecycle.local</groupId>
  <artifactId>pulsar-standalone-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.pulsar</groupId><artifactId>pulsar-broker</artifactId><version>{version}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

_CLIENT_TOOLS_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pulsar-lifecycle.local</groupId>
  <artifactId>pulsar-client-tools-runtime</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency><groupId>com.fasterxml.jackson</groupId><artifactId>jackson-bom</artifactId><version>{jackson}</version><type>pom</type><scope>import</scope></dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency><groupId>org.apache.pulsar</groupId><artifactId>pulsar-client-tools</artifactId><version>{version}</version></dependency>
{extra}    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""

# Every repository a POM names goes to Maven Central: the release's parent POM also lists
# Confluent's, which is neither needed nor reachable from every machine.
_SETTINGS = """<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors><mirror><id>maven-central-only</id><mirrorOf>*</mirrorOf><url>{central}</url></mirror></mirrors>
</settings>
"""


def _cached(home: Path, pom: str) -> Optional[List[str]]:
    """The cached classpath of `home`, or None when it is missing, incomplete or was resolved
    from another POM than `pom` (resolved again then; the jars it has stay in its m2/)."""
    cp_file = home / "classpath.txt"
    if not cp_file.is_file():
        return None
    pom_file = home / "pom.xml"
    if pom_file.is_file() and pom_file.read_text() != pom:
        return None
    jars = [p for p in cp_file.read_text().strip().split(os.pathsep) if p]
    if not jars or not all(Path(j).is_file() for j in jars):
        return None
    return jars


def _maven_failure(output: str, what: str) -> str:
    """One line out of Maven's output: the artifact that did not resolve, or the last error."""
    for pattern in (r"Could not find artifact (\S+)", r"The following artifacts could not be resolved: ([^:]+:[^:]+:[^:]+:[^:,]+)",
                    r"Could not transfer artifact (\S+)", r"Could not resolve dependencies[^:]*: (.*?)(?: -> |$)"):
        m = re.search(pattern, output)
        if m:
            return (f"{what} does not resolve from Maven Central ({m.group(1)}): check that "
                    f"{MAVEN_CENTRAL} is reachable, or pick another release with PULSAR_LIFECYCLE_PULSAR_VERSION")
    errors = [ln for ln in output.splitlines() if "[ERROR]" in ln and ln.strip() != "[ERROR]"]
    last = errors[0].split("[ERROR]", 1)[1].strip()[:300] if errors else output.strip()[-300:]
    return f"resolving {what} with Maven failed: {last}"


def resolve(version: Optional[str] = None, progress: bool = True) -> PulsarRelease:
    """The release's classpath, resolved with Maven on first use and cached for later runs."""
    version = version or pinned_version()
    return _resolve_set(f"pulsar-{version}", _POM.format(version=version, log4j=LOG4J_VERSION),
                        f"Apache Pulsar {version}", version, "about 260 MB", progress)


def resolve_client_tools(progress: bool = True) -> PulsarRelease:
    """`pulsar-admin`'s classpath (`org.apache.pulsar:pulsar-client-tools`), a second artifact
    set in the cache next to the release's: run `org.apache.pulsar.admin.cli.PulsarAdminTool`
    from it. Jackson is pinned to the one version of its BOM: a mixed resolution fails
    `functions create --function-config-file` with a NoSuchMethodError."""
    version = CLIENT_TOOLS_VERSION
    return _resolve_set(f"pulsar-client-tools-{version}",
                        _CLIENT_TOOLS_POM.format(version=version, jackson=CLIENT_TOOLS_JACKSON, log4j=LOG4J_VERSION, extra=""),
                        f"pulsar-client-tools {version}", version, "about 100 MB", progress)


LOCAL_RUNNER_DEPENDENCY = ("    <dependency><groupId>org.apache.pulsar</groupId>"
                           "<artifactId>pulsar-functions-local-runner-original</artifactId>"
                           "<version>{version}</version><exclusions><exclusion><groupId>org.apache.pulsar</groupId>"
                           "<artifactId>jetcd-core-shaded</artifactId></exclusion></exclusions></dependency>\n")
# jetcd-core-shaded (the etcd metadata store's client) is not on Maven Central as a jar, and a
# local runner talking to a broker does not use it. Two of what Maven picks (nearest wins) are
# pinned: the local runner brings log4j-api 2.23.1, which beside log4j-core 2.24.3 fails every
# command at start (NoSuchFieldError: INSTANCE in LoggerContext), and protobuf-java 3.22.0, older
# than the 3.25 its pulsar-functions-proto classes were generated with (NoClassDefFoundError:
# com/google/protobuf/MapFieldReflectionAccessor as LocalRunner reads the function config).
LOCAL_RUNNER_PROTOBUF = "3.25.8"
LOCAL_RUNNER_PINS = ("    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId>"
                     "<version>{log4j}</version></dependency>\n"
                     "    <dependency><groupId>com.google.protobuf</groupId><artifactId>protobuf-java</artifactId>"
                     "<version>{protobuf}</version></dependency>\n")


def resolve_local_runner(progress: bool = True) -> PulsarRelease:
    """`pulsar-admin functions localrun`'s classpath: pulsar-client-tools and Pulsar's LocalRunner
    (`pulsar-functions-local-runner-original`), both CLIENT_TOOLS_VERSION, a third artifact set in
    the cache (about 60 MB more than the client tools): run `PulsarAdminTool functions localrun`
    from it."""
    version = CLIENT_TOOLS_VERSION
    pom = _CLIENT_TOOLS_POM.format(version=version, jackson=CLIENT_TOOLS_JACKSON, log4j=LOG4J_VERSION,
                                   extra=LOCAL_RUNNER_DEPENDENCY.format(version=version)
                                   + LOCAL_RUNNER_PINS.format(log4j=LOG4J_VERSION, protobuf=LOCAL_RUNNER_PROTOBUF))
    return _resolve_set(f"pulsar-localrun-{version}", pom, f"pulsar-admin functions localrun {version}", version,
                        "about 160 MB", progress)


def _resolve_set(folder: str, pom: str, what: str, version: str, size: str, progress: bool) -> PulsarRelease:
    """One artifact set's classpath in cache_root()/folder, resolved with Maven the first time."""
    home = cache_root() / folder
    jars = _cached(home, pom)
    if jars:
        return PulsarRelease(version, home, jars)
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel first run resolves; we then use its result
        jars = _cached(home, pom)
        if jars:
            return PulsarRelease(version, home, jars)
        mvn = shutil.which("mvn")
        if not mvn:
            raise PulsarSetupError(f"{what} is not in {home} yet and resolving it needs Maven: "
                                   "install it (apt-get install maven) and run again")
        (home / "pom.xml").write_text(pom)
        (home / "settings.xml").write_text(_SETTINGS.format(central=MAVEN_CENTRAL))
        cp_tmp = home / "classpath.txt.tmp"
        cmd = [mvn, "-B", "-q", "-s", str(home / "settings.xml"), f"-Dmaven.repo.local={home / 'm2'}",
               "dependency:build-classpath", f"-Dmdep.outputFile={cp_tmp}", "-Dmdep.includeScope=runtime"]
        if progress and (home / "classpath.txt").is_file():
            log.warning("event=pulsar_resolving what=%r cache=%s hint='resolved before from another POM: Maven "
                        "resolves it again, downloading only what its cache lacks'", what, home)
        elif progress:
            log.warning("event=pulsar_resolving what=%r cache=%s hint='first run on this machine: Maven "
                        "downloads %s from Maven Central once'", what, home, size)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=home, capture_output=True, text=True, timeout=1800)
        except subprocess.TimeoutExpired as exc:
            raise PulsarSetupError(f"resolving {what} took over 30 minutes: "
                                   f"check the network to {MAVEN_CENTRAL}") from exc
        if proc.returncode != 0 or not cp_tmp.is_file():
            (home / "maven.log").write_text(proc.stdout + proc.stderr)
            raise PulsarSetupError(_maven_failure(proc.stdout + proc.stderr, what))
        jars = [p for p in cp_tmp.read_text().strip().split(os.pathsep) if p]
        os.replace(cp_tmp, home / "classpath.txt")
        log.info("event=pulsar_resolved what=%r jars=%d seconds=%.1f cache=%s", what, len(jars),
                 time.monotonic() - t0, home)
        return PulsarRelease(version, home, jars)


if __name__ == "__main__":  # scripts/setup.sh: resolve ahead of the first test or demo run
    import sys

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        release = resolve()
        tools = resolve_client_tools() if "--client-tools" in sys.argv[1:] else None
        localrun = resolve_local_runner() if "--client-tools" in sys.argv[1:] else None
    except PulsarSetupError as exc:
        sys.exit(f"Error: {exc}")
    print(f"Apache Pulsar {release.version}: {len(release.classpath)} jars in {release.home}")
    if tools is not None:
        print(f"pulsar-client-tools {tools.version}: {len(tools.classpath)} jars in {tools.home}")
    if localrun is not None:
        print(f"pulsar-admin functions localrun {localrun.version}: {len(localrun.classpath)} jars in {localrun.home}")
