#!/usr/bin/env bash
# Sets up and runs the whole test suite against the real embedded broker.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
# Lint (ruff: pyflakes, import order, bugbear) and type-check the library first: both take seconds.
.venv/bin/python -m ruff check shared functions tests bench scripts
.venv/bin/python -m mypy
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
fi
# The whole suite in two passes: first the tests that assert a lateness bound under SIGKILLs
# (marker `timing`), one at a time, since the bound needs the machine's cores; then everything
# else on three workers (pytest-xdist): those tests mostly wait on brokers and subprocesses and
# assert counts, not times. Each pass starts its own brokers; both always run. Short tracebacks:
# a failure shows its assertion and message, not pages of test source.
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider --tb=short --durations=15 -m timing || status=$?
# --dist loadgroup: a module marked xdist_group (the real function worker's) runs on one worker,
# sharing its standalone; every other test is dealt out as before.
.venv/bin/python -m pytest -q -p no:cacheprovider --tb=short -n "${TEST_WORKERS:-3}" --dist loadgroup --durations=40 -m "not timing" || status=$?
exit "$status"
