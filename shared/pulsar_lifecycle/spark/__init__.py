"""The offline pipeline on Spark (PySpark): seed and verify bucket snapshots, audit orphan ledgers.

PySpark is an optional dependency (`pip install 'pulsar-lifecycle[spark]'`): nothing here imports
it at module level except the job modules, which the CLI imports only when a command runs.

Modules:
    session   get_spark(master, app_name): one configured SparkSession; a clear error when Java
              or PySpark is missing or too old; the Spark log file; SPARK_HOME for local-cluster.
    paths     every path a job takes resolved on the driver; local paths executors cannot reach refused.
    failures  a failed Spark call as one line: the file or endpoint and the failing code's own message.
    progress  a rich console view of a running Spark job (stages, tasks, rows per second).
    cli       the `pulsar-lifecycle spark ...` click group.
"""

__all__ = ["SparkSetupError"]

from .errors import SparkSetupError
