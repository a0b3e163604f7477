#!/usr/bin/env bash
# Sets up and runs the whole system on the embedded broker (no Pulsar needed), or with --pulsar
# on a real Apache Pulsar standalone on loopback (Java 17+ and Maven: setup installs them);
# --spark adds the offline pipeline (PySpark seed and verify; Java 17+ and the `spark` extra).
set -euo pipefail
cd "$(dirname "$0")/.."
extra=local
for arg in "$@"; do
  # setup.sh then installs Maven and resolves the Pulsar release once per machine.
  if [ "$arg" = "--pulsar" ]; then export PULSAR_LIFECYCLE_REAL_PULSAR=1; fi
  # --spark adds the offline pipeline's scene: setup.sh installs Java 17 and the `spark` extra.
  if [ "$arg" = "--spark" ]; then extra=local,spark; fi
done
scripts/setup.sh "$extra"
# pulsar-client's own warnings (e.g. the dedup probes' "Topic has no messages") go to a file.
mkdir -p .pulsar-lifecycle
export PULSAR_LIFECYCLE_CLIENT_LOG="${PULSAR_LIFECYCLE_CLIENT_LOG:-$(pwd)/.pulsar-lifecycle/demo-client.log}"
echo "pulsar-client log: $PULSAR_LIFECYCLE_CLIENT_LOG"
exec .venv/bin/pulsar-lifecycle --log-level WARNING demo "$@"
