#!/usr/bin/env bash
# The task images, offline (reused by hash when their recipe is unchanged: seconds):
#   scripts/build-images.sh          the CPU images `air run` needs
#   scripts/build-images.sh --test   then the toolchain image the SandboxFusion language tests run on (the CPU
#                                    image plus Debian's compilers, staged on the host; about 3.5 min the first time)
# Run by scripts/setup.sh, or by .ci/run while the Docker-free tests run (setup.sh --images-later).
set -euo pipefail
case "${1:-}" in
  ""|--test) [ $# -le 1 ] || { echo "build-images: one option at most (--test)" >&2; exit 2; } ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-images: unknown option $1 (--test, --help)" >&2; exit 2 ;;
esac
air images build
if [ "${1:-}" = "--test" ]; then
  air images build toolchain
fi
