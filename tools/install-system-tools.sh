#!/usr/bin/env bash
# Installs the system tools that `make test` runs and pip cannot provide, from Debian's packages:
# - Prometheus and promtool (`prometheus`): the live metrics check runs a real Prometheus; the recording
#   rules and alerts are unit-tested with promtool. Needed: without them the script fails.
# - dnsmasq (`dnsmasq-base`: the program alone, no system service): the cluster DNS of the across-hosts
#   test (tests/hosts). That test makes network namespaces, so it runs only as root and skips, saying
#   why, without root or dnsmasq: dnsmasq is installed for root only, and its absence is a note here.
# Does nothing when everything wanted is already there.
set -euo pipefail

PACKAGES=()
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "prometheus and promtool are needed by the tests: install your distribution's prometheus package" >&2
    exit 1
  fi
  PACKAGES+=(prometheus)
fi
if [ "$(id -u)" -eq 0 ] && ! PATH="$PATH:/usr/sbin:/sbin" command -v dnsmasq >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    PACKAGES+=(dnsmasq-base)
  else
    echo "note: no dnsmasq here, so the across-hosts test will skip: install your distribution's dnsmasq" >&2
  fi
fi
if [ ${#PACKAGES[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "prometheus and promtool are needed by the tests: run 'apt-get install prometheus' as root" >&2
    exit 1
  fi
  SUDO="sudo"
fi
echo "installing Debian's packages for the tests: ${PACKAGES[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
# The package's service is not what the tests use: they start their own Prometheus on a free port.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
  $SUDO systemctl stop prometheus || true
fi
