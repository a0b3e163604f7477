#!/usr/bin/env bash
# Sets up and runs the whole test suite against the real embedded broker.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
