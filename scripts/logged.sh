# Sourced by setup.sh, ensure-docker.sh and gvisor-docker.sh (each defines `say` and sets AIR_SETUP_LOG first).
# shellcheck shell=bash

# tried WHAT CMD...: run CMD with its output in the log, saying `still WHAT (N s so far)` every AIR_SETUP_HEARTBEAT
# seconds (default 20) while it runs, so that a set-up's output never goes quiet for minutes (an install, a
# build); returns CMD's exit code.
tried() {
  local what=$1 rc=0 beat every=${AIR_SETUP_HEARTBEAT:-20}
  shift
  [[ $every =~ ^[1-9][0-9]*$ ]] || every=20
  printf '\n$ %s\n' "$*" >>"$AIR_SETUP_LOG"
  # The heartbeat: a subshell of ours, ticking each second (so that ending it leaves no sleep of minutes behind).
  (
    trap 'exit 0' TERM
    n=0 started=$SECONDS
    while sleep 1; do
      n=$((n + 1))
      if [ "$n" -ge "$every" ]; then
        n=0
        say "still $what ($((SECONDS - started)) s so far; log: $AIR_SETUP_LOG)"
      fi
    done
  ) &
  beat=$!
  "$@" >>"$AIR_SETUP_LOG" 2>&1 || rc=$?
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$rc"
}

# logged WHAT CMD...: as tried; if CMD fails, show the log's tail and exit with CMD's code.
logged() {
  local what=$1 rc=0
  tried "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    say "$what failed (exit $rc); last lines of $AIR_SETUP_LOG:"
    tail -n 30 "$AIR_SETUP_LOG" | sed 's/^/  | /' >&2
    say "full log: $AIR_SETUP_LOG"
    exit "$rc"
  fi
}
