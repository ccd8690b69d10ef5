#!/usr/bin/env bash
# One-command set-up of a fresh machine: a Docker engine, air, and the CPU task images.
#   scripts/setup.sh          what `air run` needs
#   scripts/setup.sh --test   plus the test tools (pytest plugins, and Debian's chromium for the report test)
# Idempotent: a second run reuses the daemon, the install and the images (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-docker.sh

extra=""
if [ "${1:-}" = "--test" ]; then
  extra="[test]"
  if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing Debian's chromium (the HTML report is tested in a real browser)" >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
    else
      echo "setup: chromium is missing; install it to run the report test" >&2
    fi
  fi
fi

echo "setup: installing air (pip install -e '.${extra}')" >&2
python3 -m pip install --disable-pip-version-check -q -e ".${extra}" 2>&1 | grep -v "Running pip as the 'root' user" >&2 || true
python3 -c "import air, verifiers.v1" || { echo "setup: the install failed" >&2; exit 1; }
echo "setup: building the CPU task images (offline; the first time takes a few minutes)" >&2
air images build
