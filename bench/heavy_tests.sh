#!/usr/bin/env bash
# The suite's heavy tests (marker `heavy`): the dentry-cache channels, the host soak, a second TRL training, load with sixteen clients, an env-server worker
# killed, a second verifiers harness in the text format. Each is a boundary other tests cover in part, and
# together they cost CI minutes on two cores, so the README's test command and CI leave them out (pytest's addopts)
# and this runs them, after the set-up (`scripts/setup.sh --test`):
#
#   bench/heavy_tests.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m pytest -m heavy -n 2 --dist loadfile --durations=10 "$@"
