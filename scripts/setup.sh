#!/usr/bin/env bash
# Creates .venv and installs pulsar-lifecycle with everything it needs (idempotent).
# Usage: scripts/setup.sh [extra]   (extra: local = embedded broker, test = test suite, spark = the
# offline pipeline; several with commas: local,spark)
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-local}"
SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && SUDO="sudo"
if ! command -v python3 >/dev/null || ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  $SUDO apt-get update -q && $SUDO apt-get install -y -q python3 python3-venv python3-pip
fi
# The Spark commands (extras spark/test) and real Apache Pulsar need Java 17+; install a headless JRE
# when it is missing or older.
needs_java=0
case ",$extra," in *,test,*|*,spark,*) needs_java=1 ;; esac
if [ "$needs_java" = "1" ] || [ "${PULSAR_LIFECYCLE_REAL_PULSAR:-0}" = "1" ]; then
  java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -1 \
               | awk '{ print ($1 == 1) ? $2 : $1 }' || true)
  if [ -z "${java_major:-}" ] || [ "$java_major" -lt 17 ]; then
    $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q openjdk-17-jre-headless
  fi
fi
# Real Apache Pulsar (tests, `demo --pulsar`, benchmarks) is resolved from Maven Central with Maven,
# once per machine, into ~/.cache/pulsar-lifecycle (runtime/pulsar_release.py).
if [ "$extra" = "test" ] || [ "${PULSAR_LIFECYCLE_REAL_PULSAR:-0}" = "1" ]; then
  if ! command -v mvn >/dev/null; then
    $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q maven
  fi
fi
# The alert-rule tests evaluate deploy/prometheus/alerts.yml with Prometheus' promtool (Debian's
# prometheus package; its service is not started here).
if [ "$extra" = "test" ] && ! command -v promtool >/dev/null; then
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends prometheus
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e ".[${extra}]"
# An editable install leaves the package uncompiled, and where PYTHONDONTWRITEBYTECODE is set every
# process start (a writer's restart included) compiles it again: compile it once, as pip does a wheel.
.venv/bin/python -m compileall -q shared/pulsar_lifecycle functions >/dev/null
if [ "$extra" = "test" ] || [ "${PULSAR_LIFECYCLE_REAL_PULSAR:-0}" = "1" ]; then
  # resolves once; later runs find the cache. The test suite also runs `pulsar-admin` (client tools).
  .venv/bin/python -m pulsar_lifecycle.runtime.pulsar_release $([ "$extra" = "test" ] && echo --client-tools)
fi
echo "pulsar-lifecycle installed in $(pwd)/.venv"
