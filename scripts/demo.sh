#!/usr/bin/env bash
# Sets up and runs the whole system on the embedded broker (no Pulsar needed).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh local
exec .venv/bin/pulsar-lifecycle --log-level WARNING demo "$@"
