#!/usr/bin/env bash
# gVisor as a runtime of this machine's Docker daemon, for `AIR_DOCKER_RUNTIME=runsc` (docs/gvisor.md), idempotently:
# Debian's runsc (on Debian 12 the trixie one, 20240729, through the trixie line ensure-docker.sh pins below
# bookworm), then the runtime `runsc` in /etc/docker/daemon.json (merged, never replacing it), which a running daemon
# takes on SIGHUP without stopping a container.
#   scripts/gvisor-docker.sh          install and register
#   scripts/gvisor-docker.sh --check  say whether the daemon has it; exit 1 if not, 3 if no daemon answers
# The runtime's arguments: --network=none (air's sandboxes have none; runsc 20240729 also takes a container's new
# network namespace for the host's on Linux >= 6.11 and refuses to start), --host-uds=create (the warden listens on a
# socket in its host directory, which the host connects to; nothing in the sandbox may connect to a host socket).
set -euo pipefail

say() { echo "gvisor-docker: $*" >&2; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

check=""
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    -h|--help) usage; exit 0 ;;
    *) say "unknown option $arg (--check, --help)"; exit 2 ;;
  esac
done

has_runtime() { docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"runsc"'; }

if [ -n "$check" ]; then
  # a daemon that does not answer has no runtimes to list: said as such, not as a daemon without runsc
  docker info >/dev/null 2>&1 || { say "no Docker daemon answers (scripts/ensure-docker.sh starts one)"; exit 3; }
  if has_runtime; then say "the Docker daemon has the runtime runsc"; exit 0; fi
  say "the Docker daemon has no runtime runsc (run scripts/gvisor-docker.sh as root)"
  exit 1
fi

if ! docker info >/dev/null 2>&1; then
  say "no Docker daemon answers: run scripts/ensure-docker.sh first"
  exit 1
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  say "not root on a Debian machine: install runsc and add it to /etc/docker/daemon.json's runtimes yourself" \
      "(docs/gvisor.md)"
  exit 1
fi

AIR_SETUP_LOG=${AIR_SETUP_LOG:-$(mktemp "${TMPDIR:-/tmp}/air-gvisor.XXXXXX.log")}
# shellcheck source=logged.sh source-path=SCRIPTDIR
. "$(dirname "$0")/logged.sh"

if ! command -v runsc >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
  package=runsc
  [ -e /etc/apt/sources.list.d/air-trixie.sources ] && package=runsc/trixie
  say "installing Debian's $package (log: $AIR_SETUP_LOG)"
  if ! tried "installing $package" apt-get install -y -q "$package"; then
    logged "apt-get update" apt-get update -q
    logged "installing $package" apt-get install -y -q "$package"
  fi
fi

runsc_path=$(command -v runsc)
python3 "$(dirname "$0")/daemon_json.py" >/dev/null \
  "{\"runtimes\": {\"runsc\": {\"path\": \"$runsc_path\", \"runtimeArgs\": [\"--network=none\", \"--host-uds=create\"]}}}" || exit 1

if ! has_runtime; then
  # the daemon that reads /etc/docker/daemon.json: the one whose pid file is Docker's default, else the oldest dockerd
  pid=$(cat /var/run/docker.pid 2>/dev/null || true)
  if ! [[ $pid =~ ^[0-9]+$ ]] || [ "$(basename "$(head -z -n 1 "/proc/$pid/cmdline" 2>/dev/null | tr -d '\0')")" != dockerd ]
  then pid=$(pgrep -xo dockerd || true); fi
  [ -n "$pid" ] || { say "no dockerd process here to reload (a daemon elsewhere?): restart it yourself"; exit 1; }
  kill -HUP "$pid"
  for _ in $(seq 1 20); do has_runtime && break; sleep 0.5; done
fi
has_runtime || { say "dockerd did not take the runtime runsc (its log says why)"; exit 1; }
say "the Docker daemon has the runtime runsc ($(runsc --version 2>/dev/null | sed -n 1p))"
