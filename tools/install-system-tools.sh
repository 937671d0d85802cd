#!/usr/bin/env bash
# Installs the system tools that `make test` runs and pip cannot provide: Prometheus and promtool, from
# Debian's `prometheus` package (the live metrics check runs a real Prometheus; the recording rules and
# alerts are unit-tested with promtool). Does nothing when both are already on PATH.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "prometheus and promtool are needed by the tests: install your distribution's prometheus package" >&2
  exit 1
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "prometheus and promtool are needed by the tests: run 'apt-get install prometheus' as root" >&2
    exit 1
  fi
  SUDO="sudo"
fi
echo "installing Debian's prometheus package (prometheus, promtool) for the monitoring tests"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package's service is not what the tests use: they start their own Prometheus on a free port.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
  $SUDO systemctl stop prometheus || true
fi
