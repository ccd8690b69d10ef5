#!/usr/bin/env bash
# Make a Docker engine available, idempotently.
#  - `docker info` answers            -> nothing to do.
#  - Debian/Ubuntu and root           -> install Debian's docker.io if needed, start dockerd in the background.
#  - anywhere else                    -> fail with a message saying what to do.
# The daemon is started fully detached (own session, output to a log file, stdin from /dev/null): a background
# process that keeps the caller's stdout open makes whoever reads that output (CI) wait for it forever.
# When it starts a daemon, the script prints its pid on fd 3 if fd 3 is open, so a caller can stop it later.
# apt's output goes to a log (AIR_SETUP_LOG, shared with setup.sh), shown only when an install fails.
set -euo pipefail

TIMEOUT="${AIR_DOCKERD_TIMEOUT:-60}"
DOCKERD_LOG="${AIR_DOCKERD_LOG:-/var/log/air-dockerd.log}"

say() { echo "ensure-docker: $*" >&2; }

# Called on its own, the log is this script's (rewritten per run); under setup.sh, setup's log, appended to.
setup_log() {
  if [ -z "${AIR_SETUP_LOG:-}" ]; then
    local cache="${AIR_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/air}"
    AIR_SETUP_LOG="$cache/ensure-docker.log"
    mkdir -p "$cache" 2>/dev/null && : 2>/dev/null >"$AIR_SETUP_LOG" \
      || AIR_SETUP_LOG=$(mktemp "${TMPDIR:-/tmp}/air-ensure-docker.XXXXXX.log")
  fi
}

# shellcheck source=logged.sh source-path=SCRIPTDIR
. "$(dirname "$0")/logged.sh"

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
  setup_log
  say "installing Debian's docker.io (about a minute; log: $AIR_SETUP_LOG)"
  # Non-interactive apt; needrestart (Ubuntu) is suspended: dockerd is started below, nothing needs a restart.
  export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
  logged "apt-get update" apt-get update -q
  # policy-rc.d may refuse to start the service inside containers: expected, dockerd is started below.
  logged "installing docker.io" apt-get install -y -q docker.io
fi

if ! pgrep -x dockerd >/dev/null 2>&1; then
  say "starting dockerd (log: $DOCKERD_LOG)"
  mkdir -p "$(dirname "$DOCKERD_LOG")"
  setsid dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
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
say "dockerd did not answer within ${TIMEOUT}s; last lines of $DOCKERD_LOG:"
tail -n 20 "$DOCKERD_LOG" >&2 || true
exit 1
