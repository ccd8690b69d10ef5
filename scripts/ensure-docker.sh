#!/usr/bin/env bash
# Make a Docker engine available, idempotently.
#  - `docker info` answers            -> nothing to do.
#  - Debian/Ubuntu and root           -> install Debian's docker.io if needed, start dockerd in the background.
#  - anywhere else                    -> fail with a message saying what to do.
# The daemon is started fully detached (own session, output to a log file, stdin from /dev/null): a background
# process that keeps the caller's stdout open makes whoever reads that output (CI) wait for it forever.
# When it starts a daemon, the script prints its pid on fd 3 if fd 3 is open, so a caller can stop it later.
set -euo pipefail

TIMEOUT="${AIR_DOCKERD_TIMEOUT:-60}"
LOG="${AIR_DOCKERD_LOG:-/var/log/air-dockerd.log}"

say() { echo "ensure-docker: $*" >&2; }

if docker info >/dev/null 2>&1; then
  say "Docker engine is up"
  exit 0
fi

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  say "no Docker engine answers 'docker info', and this is not a Debian machine where I am root."
  say "Install and start Docker yourself (https://docs.docker.com/engine/install/), or set DOCKER_HOST."
  exit 1
fi

if [ -n "${DOCKER_HOST:-}" ] && [[ "$DOCKER_HOST" != unix://* ]]; then
  say "DOCKER_HOST=$DOCKER_HOST does not answer; not starting a local daemon for a remote host."
  exit 1
fi

if ! command -v dockerd >/dev/null 2>&1; then
  say "installing Debian's docker.io (about a minute)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # policy-rc.d may refuse to start the service inside containers: expected, we start dockerd ourselves.
  apt-get install -y -qq docker.io >/dev/null 2>&1 || apt-get install -y docker.io
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  say "starting dockerd (log: $LOG)"
  mkdir -p "$(dirname "$LOG")"
  setsid dockerd >"$LOG" 2>&1 </dev/null &
  pid=$!
  { echo "$pid" >&3; } 2>/dev/null || true
fi

for _ in $(seq 1 "$TIMEOUT"); do
  if docker info >/dev/null 2>&1; then
    say "Docker engine is up ($(docker version --format '{{.Server.Version}}' 2>/dev/null))"
    exit 0
  fi
  sleep 1
done
say "dockerd did not answer within ${TIMEOUT}s; last lines of $LOG:"
tail -n 20 "$LOG" >&2 || true
exit 1
