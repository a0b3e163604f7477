#!/usr/bin/env bash
# Sets up and runs the whole system on the embedded broker (no Pulsar needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh local
# pulsar-client's own warnings (e.g. the dedup probes' "Topic has no messages") go to a file.
mkdir -p .pulsar-lifecycle
export PULSAR_LIFECYCLE_CLIENT_LOG="${PULSAR_LIFECYCLE_CLIENT_LOG:-$(pwd)/.pulsar-lifecycle/demo-client.log}"
echo "pulsar-client log: $PULSAR_LIFECYCLE_CLIENT_LOG"
exec .venv/bin/pulsar-lifecycle --log-level WARNING demo "$@"
