"""`pulsar-lifecycle spark verify`: check every snapshot of a writer's store, optionally against an export.

    cli       the click command (imports the job when it runs).
    driver    the job on the Spark driver: the manifest's cross-bucket checks, the comparison with
              the export, the report and its PNG.
    executor  what runs in the Spark executors' Python workers (no PySpark import): the checks of
              one bucket snapshot and the mapInPandas functions that call them.
"""
