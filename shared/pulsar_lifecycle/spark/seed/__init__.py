"""`pulsar-lifecycle spark seed`: build a new writer's bucket snapshots from exported backlog files.

    cli       the click command (imports the job when it runs).
    driver    the job on the Spark driver: store checks, planning, tombstones, the output check,
              the manifest written last.
    direct    the direct path's plan (which Parquet row groups each task reads); pure, no PySpark:
              the driver plans with it, executors receive its SeedTask records.
    executor  what runs in the Spark executors' Python workers (no PySpark import): reading a
              task's rows, building and writing one bucket, reading a written snapshot back.
"""
