"""`pulsar-lifecycle export-backlog`: drain a stopped writer's scheduling subscription into Parquet.

Runs in the command's process only (no Spark, no executor side):
    cli       the click command.
    driver    the drain (one consumer pass, part files written atomically, acks after the rename)
              and `--jobs-file` imports.
    held      a resumed export's Reader pass over what a killed exporter's consumer still holds.
"""
