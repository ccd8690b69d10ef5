#!/usr/bin/env bash
# Make a Docker engine available, idempotently.
#  - `docker info` answers            -> nothing to do (`air doctor` says if that engine has a known deadlock).
#  - Debian/Ubuntu and root           -> install an engine if needed, start dockerd in the background.
#  - anywhere else                    -> fail with a message saying what to do.
# The engine: on Debian 12 (bookworm), Debian 13's docker.io 26.1 and containerd 1.7 (their dependencies are
# bookworm's; the rest of the machine stays bookworm: the trixie line is pinned below every bookworm package), with
# bookworm's runc. Bookworm's own docker.io 20.10 deadlocks under several air processes at once (moby/moby#46661:
# libnetwork's lock order, fixed after 20.10) and is replaced when found stopped. Elsewhere, the distribution's.
# The daemon runs with live-restore (/etc/docker/daemon.json): a restart of dockerd keeps sandboxes running, and
# their episodes go on (the warden speaks on a socket of its own, not through dockerd).
# The daemon is started fully detached (own session, output to a log file, stdin from /dev/null): a background
# process that keeps the caller's stdout open makes whoever reads that output (CI) wait for it forever.
# When it starts a daemon, the script prints its pid on fd 3 if fd 3 is open, so a caller can stop it later.
# apt's output goes to a log (AIR_SETUP_LOG, shared with setup.sh), shown only when an install fails.
set -euo pipefail

TIMEOUT="${AIR_DOCKERD_TIMEOUT:-60}"
DOCKERD_LOG="${AIR_DOCKERD_LOG:-/var/log/air-dockerd.log}"

say() { echo "ensure-docker: $*" >&2; }
for arg in "$@"; do  # it takes no arguments: a typo is said before anything is installed or started
  case "$arg" in
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) say "unknown option $arg (it takes none; --help says what it does)"; exit 2 ;;
  esac
done
if ! [[ $TIMEOUT =~ ^[0-9]{1,5}$ ]] || [ "$TIMEOUT" -lt 1 ]; then
  say "AIR_DOCKERD_TIMEOUT must be a number of seconds (1 or more), not '$TIMEOUT'"; exit 2
fi

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

# shellcheck disable=SC1091
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
installed=$(dpkg-query -W -f='${Version}' docker.io 2>/dev/null || true)
if ! command -v dockerd >/dev/null 2>&1 || { [ "$codename" = bookworm ] && [[ "$installed" == 20.10.* ]] \
    && ! pgrep -x dockerd >/dev/null 2>&1; }; then
  setup_log
  export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1
  if [ "$codename" = bookworm ]; then
    say "installing Debian 13's docker.io 26.1 on Debian 12 (about a minute; log: $AIR_SETUP_LOG)"
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -n 1)
    mirror=${mirror:-$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
    printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: %s\n' "${mirror:?no Debian mirror in /etc/apt}" \
      /usr/share/keyrings/debian-archive-keyring.gpg >/etc/apt/sources.list.d/air-trixie.sources
    printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' >/etc/apt/preferences.d/air-trixie
    logged "apt-get update" apt-get update -q
    logged "installing docker.io" apt-get install -y -q --no-install-recommends \
      docker.io/trixie containerd/trixie docker-cli/trixie runc tini iptables
  else
    say "installing the distribution's docker.io (about a minute; log: $AIR_SETUP_LOG)"
    logged "apt-get update" apt-get update -q
    # policy-rc.d may refuse to start the service inside containers: expected, dockerd is started below.
    logged "installing docker.io" apt-get install -y -q docker.io
  fi
fi

# A GPU node without the NVIDIA container toolkit: CDI on, and a spec of this machine's GPUs and driver files
# (docs/gpu.md; a daemon already running takes it at its next start).
cdi=false
if [ -e /dev/nvidiactl ] && ! command -v nvidia-container-runtime-hook >/dev/null 2>&1; then
  if python3 "$(dirname "$0")/../air/sandbox/gpus.py" cdi-spec /etc/cdi/air-nvidia.json; then
    cdi=true
  else
    say "no CDI spec written: air passes GPUs as device nodes (air doctor)"
  fi
fi

# live-restore: containers outlive a restart of the daemon (merged into an existing daemon.json, never replacing it).
settings='{"live-restore": true}'
$cdi && settings='{"live-restore": true, "features": {"cdi": true}}'
python3 "$(dirname "$0")/daemon_json.py" "$settings" >/dev/null \
  || say "could not set live-restore in /etc/docker/daemon.json; sandboxes end when dockerd restarts"

# A daemon that did not stop cleanly (a killed session, a machine snapshot taken while it ran) leaves its pid files,
# and on a machine started afresh their pids may belong to other processes by now. dockerd then refuses to start
# ("process with PID N is still running"), and takes a containerd.pid naming a live process for its containerd,
# whose socket never answers. A file naming a process that is not the daemon it was written by is stale: removed.
# One naming that daemon is kept, and never a process is signalled.
drop_stale_pidfile() {  # drop_stale_pidfile FILE NAME
  local file=$1 name=$2 pid
  [ -f "$file" ] || return 0
  pid=$(tr -dc 0-9 <"$file" 2>/dev/null || true)
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then return 0; fi
  say "removing $file, left by a $name that is gone (pid ${pid:-none} is not a $name now)"
  rm -f "$file"
}

if ! pgrep -x dockerd >/dev/null 2>&1; then
  drop_stale_pidfile /var/run/docker.pid dockerd
  drop_stale_pidfile /var/run/docker/containerd/containerd.pid containerd
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
