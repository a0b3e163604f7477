"""One configured SparkSession for the pipeline's jobs (and the tests' session fixture).

Settings come from reference/pyspark-on-this-machine.md: the driver binds to loopback
(SPARK_LOCAL_IP), Python workers run this interpreter (PYSPARK_PYTHON; otherwise they run
`python3` from PATH without our packages), no UI, quiet log4j, session time zone UTC. A missing
or too old Java is one SparkSetupError saying how to fix it, instead of Spark's
JAVA_GATEWAY_EXITED after a few seconds.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from importlib import resources
from pathlib import Path
from typing import Any, Optional, Tuple

from .errors import SparkSetupError

MIN_JAVA = 17  # PySpark 4 needs Java 17+
MIN_PYSPARK = (4, 0)
DEFAULT_MASTER = "local[*]"
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


def log4j_config() -> Path:
    """The quiet log4j2 config shipped with the package (root at error, Spark's banners off)."""
    return Path(str(resources.files(__package__).joinpath("log4j2.properties")))


def get_spark(master: Optional[str] = None, app_name: str = "pulsar-lifecycle", **conf: Any) -> Any:
    """A SparkSession for `master` (default local[*]; any Spark master URL works).

    Extra Spark settings go in `conf`, e.g. `get_spark("local[2]", "x", **{"spark.sql.shuffle.partitions": "8"})`.
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
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j_config()}")
               .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j_config()}"))
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    for key, value in conf.items():
        builder = builder.config(key, str(value))
    try:
        return builder.getOrCreate()
    except Exception as exc:  # py4j/Spark raise assorted types; one clear error for the CLI
        raise SparkSetupError(f"cannot start Spark (master {master}): {exc}") from exc
