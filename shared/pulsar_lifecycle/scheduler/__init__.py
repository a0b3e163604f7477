"""BucketSnapshotWriter's service: intake, release thread, commits (Pulsar I/O adapter)."""
