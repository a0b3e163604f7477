#!/usr/bin/env bash
# Sets up and runs the whole test suite against the real embedded broker.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
# Lint (ruff: pyflakes, import order, bugbear) and type-check the library first: both take seconds.
.venv/bin/python -m ruff check shared functions tests bench
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
