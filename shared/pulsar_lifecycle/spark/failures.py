"""A failed Spark call as one line: what was being done, and the cause in the failing code's own words.

PySpark hands a JVM failure over as a Py4J wrapper ("An error occurred while calling o42.load.")
or a captured exception whose text holds the Java and Python stack traces; a task failure is a
`Job aborted due to stage failure` whose cause is the executor's exception, for a Python task a
whole traceback. `cause_of` walks the Java cause chain to the innermost exception with a message
(`...part-1.parquet is not a Parquet file. Expected magic number at tail ...`), and of a Python
traceback keeps the exception line. The full text goes to the Spark log file, not the console.
"""
from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator, List, Optional

from ..exceptions import PulsarLifecycleError
from .errors import SparkJobError

__all__ = ["cause_of", "is_spark_failure", "spark_step"]

_LOST_TASK = re.compile(r"most recent failure: Lost task [^:]*?\): (.*)", re.DOTALL)
_PY_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*): ?(.*)$")
# A file URL in a Java message ("... reading file file:/data/part-1.parquet. Could not ...").
_LOCATION = re.compile(r"\b(?:file|hdfs|s3a?|s3n|gs|abfss?|wasbs?|viewfs):/[^\s'\"\],;]*[^\s'\"\],;.]")
_WRAPPERS = ("org.apache.spark.api.python.PythonException: ", "org.apache.spark.SparkException: ")
MAX_CHAIN = 20
MAX_CHARS = 600


def is_spark_failure(exc: BaseException) -> bool:
    """True for what PySpark and Py4J raise when the JVM or a task fails."""
    try:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException
    except ImportError:  # without PySpark nothing Spark-made can be raised
        return False
    return isinstance(exc, (Py4JError, PySparkException))


def _java_throwable(exc: BaseException) -> Any:
    """The JVM exception behind a Py4J or captured PySpark exception, or None."""
    java = getattr(exc, "java_exception", None)  # py4j.protocol.Py4JJavaError
    if java is None:
        java = getattr(exc, "_origin", None)  # pyspark.errors.exceptions.captured.CapturedException
    return java


def _chain(throwable: Any) -> List[str]:
    """Messages of the Java cause chain, outermost first (a class name where there is no message)."""
    out: List[str] = []
    seen = set()
    t = throwable
    while t is not None and len(out) < MAX_CHAIN:
        try:
            ident = t.hashCode()
            if ident in seen:
                break
            seen.add(ident)
            message = t.getMessage()
            out.append(str(message) if message else str(t.getClass().getSimpleName()))
            t = t.getCause()
        except Exception:  # a dead gateway answers nothing: keep what was read
            break
    return out


def _python_exception_line(text: str) -> Optional[str]:
    """The exception line of a Python traceback in `text` (the last unindented line after it)."""
    at = text.rfind("Traceback (most recent call last)")
    if at < 0:
        return None
    lines = [ln for ln in text[at:].splitlines()[1:] if ln.strip() and not ln.startswith((" ", "\t"))]
    for line in reversed(lines):
        if line.startswith(("During handling", "The above exception", "JVM stacktrace", "Driver stacktrace")):
            continue
        m = _PY_EXC_LINE.match(line)
        if m:
            name = m.group(1).rsplit(".", 1)[-1]
            return f"{name}: {m.group(2)}" if m.group(2) else name
    return None


def clean(message: str) -> str:
    """One line of a Spark/Java/Python failure message: a task failure's own exception, a
    traceback's exception line, else the first line; no error-class boilerplate."""
    text = message
    m = _LOST_TASK.search(text)
    if m:
        text = m.group(1).split("\nDriver stacktrace:", 1)[0]
    py = _python_exception_line(text)
    if py is not None:
        text = py
    else:
        for wrapper in _WRAPPERS:
            if text.startswith(wrapper):
                text = text[len(wrapper):]
        text = text.strip().splitlines()[0] if text.strip() else text
    text = re.sub(r"\s*SQLSTATE: \w+\.?\s*$", "", " ".join(text.split()))
    return text[:MAX_CHARS] + ("..." if len(text) > MAX_CHARS else "")


def cause_of(exc: BaseException) -> str:
    """The cause of a Spark failure in one line: the innermost Java exception's message (a task's
    Python exception line for a Python task), else the exception's own first line. When that
    message names no file but an outer one does, the file goes in front."""
    java = _java_throwable(exc)
    lines = [clean(m) for m in reversed(_chain(java))] if java is not None else []  # innermost first
    lines = [ln for ln in lines if ln and not ln.startswith("Job aborted due to stage failure")]
    if not lines:
        return clean(str(exc)) or type(exc).__name__
    cause = lines[0]
    if not _LOCATION.search(cause):
        where = next((m.group(0) for m in map(_LOCATION.search, lines[1:]) if m), None)
        if where:
            cause = f"{where}: {cause}"
    return cause


@contextlib.contextmanager
def spark_step(what: str) -> Iterator[None]:
    """Turn a Spark failure inside the block into SparkJobError(`what`: cause); `what` names the
    file, store or endpoint being worked on. The package's own errors pass unchanged."""
    try:
        yield
    except PulsarLifecycleError:
        raise
    except Exception as exc:
        if not is_spark_failure(exc):
            raise
        raise SparkJobError(f"{what}: {cause_of(exc)}") from exc
