#!/bin/bash
# enroot-build.sh: NVIDIA's enroot (the rootless container runtime of Slurm clusters) built on this machine from
# copies of its public source trees, for air's enroot backend (docs/hpc.md). Neither PyPI nor Debian ships enroot:
# CI builds it from the archives in ../shared/vendor (.ci/node-lanes); a machine without them skips the enroot tests
# and says so.
#
#   ENROOT_SRC=/path/to/enroot MAKESELF_SRC=/path/to/makeself scripts/enroot-build.sh build
#   scripts/enroot-build.sh deps       Debian's packages enroot builds and runs with (root)
#   scripts/enroot-build.sh env        prints `export PATH=...` for the built enroot
#   scripts/enroot-build.sh version    the version built (what `build` recorded), or exit 1 when none is
#
# ENROOT_SRC: a tree (a checkout or `git archive`) of github.com/NVIDIA/enroot at 8ea147d (v4.1.2).
# MAKESELF_SRC: a tree of github.com/megastep/makeself, enroot's deps/makeself submodule.
# ENROOT_BUILD_DIR (default /opt/air-enroot as root, where every user of the node can run it; else
# ~/.cache/air-enroot, the user's own): where the copy is built and installed (prefix/, readable by every user), never
# the work tree; prefix/VERSION says what was built, from which commit, and when. It must be new, empty or one this
# script made (its marker .air-made-by says so): only then are its src/ and prefix/ replaced. Sources inside it (or
# it inside them) are refused before anything is deleted.
#
# The recipe (../shared/reference/reach.md, "enroot builds here"): glibc, not enroot's vendored musl
# (FORCE_GLIBC=y); the kernel headers from /usr/include for the absent deps/linux-headers submodule; Debian's libbsd
# linked statically for strlcat, which the vendored one lacks on glibc 2.36.
set -euo pipefail

if [ "$(id -u)" -eq 0 ]; then
  W=${ENROOT_BUILD_DIR:-/opt/air-enroot}  # root builds for the node's users: not under root's own home (0700)
else
  W=${ENROOT_BUILD_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/air-enroot}
fi
WANT_VERSION=4.1.2
DEPS=(build-essential libbsd-dev libcap-dev jq parallel squashfs-tools zstd pigz curl uidmap)

say() { echo "enroot-build: $*" >&2; }
# shellcheck source=owned.sh source-path=SCRIPTDIR
. "$(dirname "$0")/owned.sh"
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

deps() {
  [ "$(id -u)" -eq 0 ] || { say "deps installs Debian packages: run it as root"; exit 1; }
  # A new machine's package lists may be empty (a container's image ships none): read them first.
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${DEPS[@]}" >/dev/null
  say "installed: ${DEPS[*]}"
}

check_sources() {
  local enroot=${ENROOT_SRC:-} makeself=${MAKESELF_SRC:-}
  [ -n "$enroot" ] || { say "set ENROOT_SRC to a tree of github.com/NVIDIA/enroot (8ea147d, v$WANT_VERSION)"; exit 2; }
  [ -n "$makeself" ] || { say "set MAKESELF_SRC to a tree of github.com/megastep/makeself"; exit 2; }
  if [ ! -f "$enroot/Makefile" ] || [ ! -f "$enroot/enroot.in" ]; then
    say "ENROOT_SRC=$enroot is not enroot's tree (no Makefile and enroot.in)"; exit 2
  fi
  [ -f "$makeself/makeself.sh" ] || { say "MAKESELF_SRC=$makeself is not makeself's tree (no makeself.sh)"; exit 2; }
  apart ENROOT_SRC "$enroot" ENROOT_BUILD_DIR "$W"  # the build replaces its src/ and prefix/: never a source tree
  apart MAKESELF_SRC "$makeself" ENROOT_BUILD_DIR "$W"
  claimable "$W" enroot-build.sh
  local version
  version=$(sed -n 's/^VERSION *:= *//p' "$enroot/Makefile")
  [ "$version" = "$WANT_VERSION" ] || say "ENROOT_SRC is version ${version:-unknown}, not $WANT_VERSION: building it anyway"
  local missing=()
  for tool in gcc make pkg-config mksquashfs jq; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [ -f /usr/include/bsd/string.h ] || missing+=(libbsd-dev)
  [ -f /usr/include/sys/capability.h ] || missing+=(libcap-dev)
  [ ${#missing[@]} -eq 0 ] || { say "missing: ${missing[*]} (run \`scripts/enroot-build.sh deps\` as root)"; exit 1; }
}

build() {
  check_sources
  claim "$W" enroot-build.sh  # a folder of the user's is refused here, before anything in it is deleted
  local tree=$W/src prefix=$W/prefix t0
  t0=$(date +%s.%N)
  wipe "$W" enroot-build.sh "$tree" && mkdir -p "$tree"
  cp -a "$ENROOT_SRC/." "$tree/"
  wipe "$W" enroot-build.sh "$tree/deps/makeself" && cp -a "$MAKESELF_SRC/." "$tree/deps/makeself/"
  # deps/linux-headers is a submodule of kernel headers: the system's serve, and its stamp says they are in place.
  mkdir -p "$tree/deps/dist/linux" "$tree/deps/linux-headers"
  ln -sfn /usr/include "$tree/deps/dist/linux/include"
  touch "$tree/deps/linux-headers/.stamp"
  wipe "$W" enroot-build.sh "$prefix"
  make -C "$tree" -s FORCE_GLIBC=y LDLIBS="-l:libbsd.a -l:libbsd.so.0" prefix="$prefix" install >"$W/build.log" 2>&1 \
    || { tail -20 "$W/build.log" >&2; say "make failed (log: $W/build.log)"; exit 1; }
  chmod -R a+rX "$prefix"  # every user of the node runs it (a umask of 077 would keep it root's)
  local version commit
  version=$("$prefix/bin/enroot" version)
  commit=$(git -C "$ENROOT_SRC" rev-parse --short HEAD 2>/dev/null || echo "a tree without git")
  printf 'enroot %s\nsource %s (%s)\nbuilt %s in %.1f s\n' "$version" "$ENROOT_SRC" "$commit" \
    "$(date -u +%FT%TZ)" "$(awk "BEGIN { print $(date +%s.%N) - $t0 }")" >"$prefix/VERSION"
  cat "$prefix/VERSION" >&2
  say "built: $prefix/bin/enroot (scripts/enroot-build.sh env prints its PATH)"
  local d=$prefix
  while [ "$d" != / ]; do  # a folder on the way that others cannot enter keeps it from them (root's home: 0700)
    if [ $((8#$(stat -c %a "$d") & 1)) -eq 0 ]; then
      say "other users cannot reach it: $d is $(stat -c %a "$d"); build into a folder they can enter" \
          "(ENROOT_BUILD_DIR=/opt/air-enroot, the default as root)"
      break
    fi
    d=$(dirname "$d")
  done
}

# shellcheck disable=SC2016 # "$PATH" is the reader's, expanded where the line is run
env_() { [ -x "$W/prefix/bin/enroot" ] || { say "not built yet: run build"; exit 1; }; printf 'export PATH=%q:"$PATH"\n' "$W/prefix/bin"; }

version() { [ -f "$W/prefix/VERSION" ] || { say "not built yet: run build"; exit 1; }; cat "$W/prefix/VERSION"; }

[ $# -gt 0 ] || { usage; exit 2; }
for s in "$@"; do  # every argument first: a typo runs nothing
  case $s in
    -h|--help) usage; exit 0;;
    deps|build|env|version) ;;
    *) say "unknown step: $s (deps build env version; --help)"; exit 2;;
  esac
done
for s in "$@"; do
  case $s in
    deps) deps;; build) build;; env) env_;; version) version;;
  esac
done
