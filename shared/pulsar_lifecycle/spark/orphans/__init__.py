"""`pulsar-lifecycle spark orphans`: the offline orphan-ledger audit.

    cli             the click command (imports the job when it runs).
    driver          one scan, in order: list, read the in-use sets, classify, commit, confirm, enqueue.
    driver_frames   the Spark part: listings and in-use sets as DataFrames, one anti-join, the statuses.
    driver_listing  the bookie listing handed out to the executors in rounds of page blocks.
    executor        what runs in the Spark executors' Python workers (no PySpark import): one task's
                    page blocks of the bookie listing.
    model           records, metadata -> component, statuses (pure).
    sources         storage listings and in-use sets (bookie, S3, filesystem, snapshot stores, admin).
    state           durable scan records.
    enqueue         confirmed orphans -> phase one of two-phase deletion.
"""
