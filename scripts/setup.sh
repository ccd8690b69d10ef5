#!/usr/bin/env bash
# One-command set-up of a fresh machine: a Docker engine, air, and the CPU task images.
#   scripts/setup.sh          what `air run` needs
#   scripts/setup.sh --test   plus the test tools (pytest plugins, Debian's chromium and docker-compose)
# Idempotent: a second run reuses the daemon, the install and the images (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/ensure-docker.sh

extra=""
if [ "${1:-}" = "--test" ]; then
  extra="[test]"
  # Debian packages the tests use: chromium (the HTML report is tested in a real browser) and docker-compose 1.29
  # (pytest-docker brings up the stub SandboxFusion server with it).
  for need in "chromium:chromium:the HTML report is tested in a real browser" \
              "docker-compose:docker-compose:pytest-docker runs the stub SandboxFusion server with it"; do
    cmd=${need%%:*}; rest=${need#*:}; pkg=${rest%%:*}; why=${rest#*:}
    command -v "$cmd" >/dev/null 2>&1 && continue
    # docker-compose recommends docker.io: the engine is ensure-docker.sh's business, not this package's.
    opts=(); [ "$pkg" = docker-compose ] && opts=(--no-install-recommends)
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "setup: installing Debian's $pkg ($why)" >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "$pkg" >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "$pkg" >/dev/null; }
    else
      echo "setup: $cmd is missing; install it ($why)" >&2
    fi
  done
fi

echo "setup: installing air (pip install -e '.${extra}')" >&2
python3 -m pip install --disable-pip-version-check -q -e ".${extra}" 2>&1 | grep -v "Running pip as the 'root' user" >&2 || true
python3 -c "import air, verifiers.v1" || { echo "setup: the install failed" >&2; exit 1; }
echo "setup: building the CPU task images (offline; the first time takes a few minutes)" >&2
air images build
