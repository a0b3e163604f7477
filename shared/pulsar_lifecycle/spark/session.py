"""One configured SparkSession for the pipeline's jobs (and the tests' session fixture).

Settings come from reference/pyspark-on-this-machine.md: the driver binds to loopback
(SPARK_LOCAL_IP), Python workers run this interpreter (PYSPARK_PYTHON; otherwise they run
`python3` from PATH without our packages), no UI, session time zone UTC. A missing or too old
Java is one SparkSetupError saying how to fix it, instead of Spark's JAVA_GATEWAY_EXITED after a
few seconds.

Logs: the driver JVM's log4j writes warnings and errors (task failures with their stack traces
included) to the Spark log file (`spark_log_path`), never to the console; executors of a cluster
log to their own stderr, which the cluster manager keeps (for `local-cluster`:
`$SPARK_HOME/work/<app>/<executor>/stderr`).

`local-cluster[N,cores,MB]` (N executor JVMs on this machine, each with its own working
directory) starts its executors from `$SPARK_HOME`: `bin/`, `jars/` and `python/`, and runs
them in `$SPARK_HOME/work`. A pip-installed PySpark has the first three inside its package
directory, so without a SPARK_HOME `get_spark` builds one of symlinks (`spark_home_layout`) in
the user's cache, and the executors' work directories go there instead of into site-packages.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Optional, Tuple

from .errors import SparkSetupError
from .failures import cause_of

MIN_JAVA = 17  # PySpark 4 needs Java 17+
MIN_PYSPARK = (4, 0)
DEFAULT_MASTER = "local[*]"
SPARK_LOG_ENV = "PULSAR_LIFECYCLE_SPARK_LOG"
DEFAULT_SPARK_LOG = Path(".pulsar-lifecycle") / "logs" / "spark.log"
LOG_PROPERTY = "pulsar_lifecycle.spark_log"  # the driver's log4j config writes to ${sys:<this>}
_JAVA_HINT = ("install a JDK/JRE 17+ (Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless; "
              "scripts/setup.sh does it) or point JAVA_HOME at one")


def java_executable() -> Optional[str]:
    """The java Spark's launcher will use: $JAVA_HOME/bin/java when JAVA_HOME is set, else PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        cand = Path(home) / "bin" / "java"
        return str(cand) if cand.exists() else None
    return shutil.which("java")


def parse_java_version(text: str) -> int:
    """Major version from `java -version` output (`"1.8.0_392"` -> 8, `"17.0.15"` -> 17)."""
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        raise ValueError(f"cannot find a version in {text.strip()[:200]!r}")
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def check_java() -> Tuple[str, int]:
    """(java path, major version); SparkSetupError when Java is missing or older than MIN_JAVA."""
    java = java_executable()
    if java is None:
        where = f"JAVA_HOME={os.environ['JAVA_HOME']} has no bin/java" if os.environ.get("JAVA_HOME") \
            else "no `java` on PATH"
        raise SparkSetupError(f"Spark needs Java {MIN_JAVA} or newer, but {where}: {_JAVA_HINT}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        major = parse_java_version(out.stderr + out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        raise SparkSetupError(f"Spark needs Java {MIN_JAVA} or newer; running `{java} -version` failed ({exc}): "
                              f"{_JAVA_HINT}") from exc
    if major < MIN_JAVA:
        raise SparkSetupError(f"Spark needs Java {MIN_JAVA} or newer, found Java {major} at {java}: {_JAVA_HINT}")
    return java, major


def check_pyspark() -> str:
    """PySpark's version; SparkSetupError when it is missing or older than MIN_PYSPARK."""
    try:
        import pyspark  # optional dependency: only the Spark commands need it
    except ImportError as exc:
        raise SparkSetupError("the Spark commands need PySpark: pip install 'pulsar-lifecycle[spark]'") from exc
    parts = tuple(int(p) for p in re.findall(r"\d+", pyspark.__version__)[:2])
    if parts < MIN_PYSPARK:
        raise SparkSetupError(f"PySpark {pyspark.__version__} is too old (need >= {'.'.join(map(str, MIN_PYSPARK))}): "
                              "pip install -U 'pulsar-lifecycle[spark]'")
    return pyspark.__version__


def log4j_config(name: str = "log4j2.properties") -> Path:
    """A log4j2 config shipped with the package: `log4j2.properties` (executors: errors on their
    stderr) or `log4j2-driver.properties` (warnings and errors to the Spark log file only)."""
    return Path(str(resources.files(__package__).joinpath(name)))


def spark_log_path() -> Path:
    """The driver's Spark log file: $PULSAR_LIFECYCLE_SPARK_LOG, else .pulsar-lifecycle/logs/spark.log
    under the working directory (the temp directory when that cannot be created); absolute."""
    configured = os.environ.get(SPARK_LOG_ENV)
    path = Path(os.path.abspath(configured or DEFAULT_SPARK_LOG))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        if configured:
            raise SparkSetupError(f"{SPARK_LOG_ENV}={configured}: cannot create {path.parent}") from None
        path = Path(tempfile.gettempdir()) / "pulsar-lifecycle-spark.log"
    return path


def spark_home_layout(base: Path) -> Path:
    """A SPARK_HOME for local-cluster masters under `base`: symlinks to the pip-installed
    PySpark's bin/, jars/ and python/, and a real work/ for the executors (built once, reused)."""
    import pyspark  # optional dependency: checked by check_pyspark first

    package = Path(pyspark.__file__).resolve().parent
    base.mkdir(parents=True, exist_ok=True)
    for name in ("bin", "jars", "python"):
        link = base / name
        if not (package / name).exists():
            raise SparkSetupError(f"PySpark at {package} has no {name}/: local-cluster masters need a Spark "
                                  "distribution; set SPARK_HOME to one")
        if link.is_symlink() and Path(os.readlink(link)) == package / name:
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(package / name, target_is_directory=True)
    (base / "work").mkdir(exist_ok=True)
    return base


def _local_cluster_home() -> None:
    """SPARK_HOME for a local-cluster master: kept when set, else the cached layout of this PySpark."""
    if os.environ.get("SPARK_HOME"):
        return
    import pyspark  # optional dependency: checked by check_pyspark first

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pulsar-lifecycle"
    os.environ["SPARK_HOME"] = str(spark_home_layout(cache / f"spark-home-{pyspark.__version__}"))


def local_cores(master: str) -> Optional[int]:
    """The executor cores of a master that runs on this machine (`local` 1, `local[N]` N,
    `local[*]` this machine's CPUs, `local-cluster[N,cores,MB]` N * cores); None for others."""
    m = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\s*\d+)?\])?", master.strip())
    if m:
        return (os.cpu_count() or 1) if m.group(1) == "*" else int(m.group(1) or 1)
    m = re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master.strip())
    return int(m.group(1)) * int(m.group(2)) if m else None


def get_spark(master: Optional[str] = None, app_name: str = "pulsar-lifecycle", **conf: Any) -> Any:
    """A SparkSession for `master` (default local[*]; any Spark master URL works).

    Extra Spark settings go in `conf`, e.g. `get_spark("local[2]", "x", **{"spark.sql.shuffle.partitions": "8"})`.
    On a master of this machine `spark.sql.shuffle.partitions` defaults to 4 per core instead of
    Spark's 200 (a cluster's default: here the tasks' overhead made `verify --against` of a
    small store take minutes on local-cluster[2,1,1024]).
    When a session already exists in this process it is returned (Spark allows one per JVM; its
    memory settings were fixed when it started).
    """
    check_java()
    check_pyspark()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # PySpark warns once about pandas 3 (not "officially" supported); it works and is faster for
    # applyInPandas (reference/pyspark-on-this-machine.md), so the warning is noise for operators.
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas", category=FutureWarning)
    from pyspark.sql import SparkSession  # optional dependency, imported when a job runs

    master = master or DEFAULT_MASTER
    if master.startswith("local-cluster"):
        _local_cluster_home()
    # py4j logs every closed connection at INFO; the CLI's log level is for this package.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    driver_opts = " ".join(shlex.quote(o) for o in (f"-Dlog4j2.configurationFile=file:{log4j_config('log4j2-driver.properties')}",
                                                     f"-D{LOG_PROPERTY}={spark_log_path()}"))
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", driver_opts)
               .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j_config()}"))
    if master.startswith("local"):  # local-cluster too: its executors reach the driver on loopback
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    cores = local_cores(master)
    if cores is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(4 * cores))
    for key, value in conf.items():
        builder = builder.config(key, str(value))
    try:
        return builder.getOrCreate()
    except Exception as exc:  # py4j/Spark raise assorted types; one clear error for the CLI
        raise SparkSetupError(f"cannot start Spark (master {master}): {cause_of(exc)}") from exc


@contextlib.contextmanager
def spark_session(master: Optional[str] = None, app_name: str = "pulsar-lifecycle", **conf: Any) -> Iterator[Any]:
    """get_spark() for one command: the session is stopped at the end when this call started it
    (a local-cluster's executors are then shut down in order instead of with the process); a
    session that was already running (a test's, a notebook's) is left running."""
    from pyspark import SparkContext  # optional dependency, imported when a job runs

    started_here = SparkContext._active_spark_context is None
    session = get_spark(master, app_name, **conf)
    try:
        yield session
    finally:
        if started_here:
            session.stop()
