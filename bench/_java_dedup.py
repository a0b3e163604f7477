"""The Java client's batched de-duplicating producer (bench/java/BatchedDedupProducer.java), compiled on first use.

Built against the Java pulsar-client from Maven Central that the test setup already resolves
(`org.apache.pulsar:pulsar-client-tools` 4.0.8 and its `pulsar-client-original`,
runtime/pulsar_release.resolve_client_tools): no download of its own. The classes go to
`<cache>/bench-java/<source hash>/`, so an edited source compiles again and a second run reuses them.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import List

from pulsar_lifecycle.runtime.pulsar_release import cache_root, java_executable, resolve_client_tools

SOURCE = Path(__file__).resolve().parent / "java" / "BatchedDedupProducer.java"
MAIN_CLASS = "BatchedDedupProducer"


class JavaBuildError(RuntimeError):
    """The Java producer could not be compiled; the message says what is missing."""


def javac() -> str:
    """`javac` beside the `java` that runs Pulsar, else the one on PATH."""
    beside = Path(java_executable()).resolve().parent / "javac"
    found = str(beside) if beside.is_file() else shutil.which("javac")
    if not found:
        raise JavaBuildError("javac not found: the Java dedup producer needs a JDK (apt-get install "
                             "openjdk-17-jdk-headless) or JAVA_HOME set to one")
    return found


def classpath() -> str:
    """The compiled producer's directory plus the Java client's jars, compiling it if needed."""
    jars = resolve_client_tools().classpath_arg
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = cache_root() / "bench-java" / digest
    if not (out / f"{MAIN_CLASS}.class").is_file():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        done = subprocess.run([javac(), "-d", str(tmp), "-cp", jars, str(SOURCE)], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise JavaBuildError(f"javac {SOURCE.name} failed: {done.stderr.strip()[-600:]}")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return f"{out}:{jars}"


def command(service_url: str, topic: str, checkpoint: Path, n: int, payload_bytes: int, resume: str,
            batched: bool, producer_name: str) -> List[str]:
    """The child's command line: `resume` is `checkpoint` or `last-sequence-id`."""
    return [java_executable(), "-Xmx256m", "-XX:+UseSerialGC", "-cp", classpath(), MAIN_CLASS, service_url, topic,
            str(checkpoint), str(n), str(payload_bytes), resume, "batched" if batched else "unbatched", producer_name]
