# Sourced by setup.sh and ensure-docker.sh (each defines `say` and sets AIR_SETUP_LOG first).
# shellcheck shell=bash

# logged WHAT CMD...: run CMD with its output in the log; if it fails, show the log's tail and exit with
# CMD's code.
logged() {
  local what=$1 rc=0
  shift
  printf '\n$ %s\n' "$*" >>"$AIR_SETUP_LOG"
  "$@" >>"$AIR_SETUP_LOG" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    say "$what failed (exit $rc); last lines of $AIR_SETUP_LOG:"
    tail -n 30 "$AIR_SETUP_LOG" | sed 's/^/  | /' >&2
    say "full log: $AIR_SETUP_LOG"
    exit "$rc"
  fi
}
