#!/bin/sh
# Which of the languages' needs this sandbox meets, probed once when the service starts.
# Usage: probe.sh NEED...  where NEED is a command (found on PATH), py:MODULE (importable by python3) or an
# absolute path (a file that must exist, such as a jar).
# Prints each need that is met, one a line; always exits 0, since a need not met is an answer, not an error.
for need in "$@"; do
  case $need in
    py:*)
      # The module name is an argument, never part of the program text.
      python3 -c 'import importlib, sys; importlib.import_module(sys.argv[1])' "${need#py:}" >/dev/null 2>&1 \
        && echo "$need" ;;
    /*)
      [ -e "$need" ] && echo "$need" ;;
    *)
      command -v "$need" >/dev/null 2>&1 && echo "$need" ;;
  esac
done
exit 0
