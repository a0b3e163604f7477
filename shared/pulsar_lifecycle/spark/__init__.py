"""The offline pipeline on Spark (PySpark): export a backlog, seed and verify bucket snapshots,
audit orphan ledgers.

PySpark is an optional dependency (`pip install 'pulsar-lifecycle[spark]'`): nothing here imports
it at module level except the jobs' driver modules, which a command imports only when it runs.

One sub-package per job, each with its command (`cli`), its driver side (`driver`, `driver_*`:
the Spark job as the driver runs it) and, where Spark tasks run Python, its executor side
(`executor`, `executor_*`: no PySpark import, nothing from the driver side); other modules of a
job are pure pieces both sides may use:
    export    `export-backlog` (runs in the command's process only, no Spark).
    seed      `spark seed`.
    verify    `spark verify`.
    orphans   `spark orphans`.

Shared by the jobs (a job package imports another job's modules never, these freely):
    cli       the `pulsar-lifecycle spark ...` click group, the options and the error handling
              every command uses.
    session   get_spark(master, app_name): one configured SparkSession; a clear error when Java
              or PySpark is missing or too old; the Spark log file; SPARK_HOME for local-cluster;
              the log4j2 configs beside it (log4j2.properties, log4j2-driver.properties).
    paths     every path a job takes resolved on the driver; local paths executors cannot reach refused.
    failures  a failed Spark call as one line: the file or endpoint and the failing code's own message.
    progress  a rich console view of a running Spark job (stages, tasks, rows per second).
    backlog   the exported backlog's format, reading it, and classifying a row as the writer does.
    settings  the writer's settings (bucket rules, intake checks) from its function config.
    store     opening a snapshot store by URL and holding its writer lock.
    errors    SparkSetupError, SparkJobError, ListingError, ScanStateError.
"""

__all__ = ["SparkSetupError"]

from .errors import SparkSetupError
