#!/usr/bin/env bash
# One-command set-up of a fresh machine: a Docker engine, air and its test tools, and the CPU task images.
# Idempotent: a second run reuses the daemon, the install and the images (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-docker.sh
echo "setup: installing air (pip install -e '.[test]')" >&2
python3 -m pip install --disable-pip-version-check -q -e '.[test]' 2>&1 | grep -v "Running pip as the 'root' user" >&2 || true
python3 -c "import air, verifiers.v1" || { echo "setup: the install failed" >&2; exit 1; }
echo "setup: building the CPU task images (offline; first time a few minutes)" >&2
air images build
