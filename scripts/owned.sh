# Sourced by the scripts that make folders or start processes (each defines `say` first): what one deletes is what
# it made, and what it ends is what it started.
#   claim DIR WHO            DIR is WHO's: its marker file DIR/.air-made-by names WHO; made so when DIR is new or
#                            empty; a folder holding anything else is refused (exit 2) before anything in it is touched
#   claimable DIR WHO        claim's refusal alone (nothing made): for a script's checks of its input
#   owned DIR WHO            whether the marker says so
#   wipe DIR WHO PATH...     rm -rf each PATH, which must lie inside DIR, while DIR's marker names WHO (checked right
#                            before: the one way these scripts delete a tree); exit 2, nothing deleted, otherwise
#   apart VAR PATH DIRVAR DIR  exit 2 when PATH (a user's source tree) and DIR (where the script writes) overlap,
#                            one inside the other, links followed: a build there would delete the sources
#   remember PIDFILE PID NAME  the pid, its start time and its program's name, for `recorded`
#   recorded PIDFILE         the pid `remember` wrote there, when that very process still runs (the same start time
#                            and program: a pid the kernel has since given another process is not ours)
#   program PID              the name of the program PID runs (its argv[0] without the folder), empty when gone
# shellcheck shell=bash

AIR_MARKER=.air-made-by

owned() { [ -f "$1/$AIR_MARKER" ] && [ ! -L "$1/$AIR_MARKER" ] && [ "$(head -n 1 "$1/$AIR_MARKER")" = "$2" ]; }

claimable() {
  local dir=$1 who=$2
  owned "$dir" "$who" && return 0
  if [ -e "$dir" ] || [ -L "$dir" ]; then
    [ -d "$dir" ] || { say "$dir is not a folder: name a new or empty folder for $who"; exit 2; }
    if [ -n "$(ls -A -- "$dir" 2>/dev/null)" ]; then
      say "$dir holds files that $who did not make (no $AIR_MARKER of its own there): name a new or empty folder"
      exit 2
    fi
  fi
}

claim() {
  claimable "$1" "$2"
  owned "$1" "$2" || { mkdir -p -- "$1" && printf '%s\n' "$2" >"$1/$AIR_MARKER"; }
}

wipe() {
  local dir=$1 who=$2 real p
  shift 2
  owned "$dir" "$who" || { say "$dir is not $who's (no $AIR_MARKER naming it there): nothing in it deleted"; exit 2; }
  real=$(realpath -m -- "$dir")
  for p in "$@"; do
    case "$(realpath -m -- "$p")" in "$real"/?*) ;; *) say "$p is not inside $dir: not deleted"; exit 2;; esac
  done
  rm -rf -- "$@"
}

apart() {
  local var=$1 path dirvar=$3 dir
  path=$(realpath -m -- "$2") dir=$(realpath -m -- "$4")
  case "$path/" in "$dir/"*) say "$var=$2 lies inside $dirvar=$4: building there would delete it; name a folder" \
                                 "apart from the sources"; exit 2;; esac
  case "$dir/" in "$path/"*) say "$dirvar=$4 lies inside $var=$2: the build would write into the sources; name a" \
                                 "folder apart from them"; exit 2;; esac
}

started() {  # PID: its start time (clock ticks after boot, /proc/PID/stat's 22nd field); nothing when it is gone
  local stat fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  read -r -a fields <<<"${stat##*) }"  # from the 3rd field on: the name in parentheses may hold spaces
  echo "${fields[19]:-}"
}

program() {
  local argv0
  argv0=$(head -z -n 1 "/proc/$1/cmdline" 2>/dev/null | tr -d '\0') || true
  echo "${argv0##*/}"
}

remember() { printf '%s %s %s\n' "$2" "$(started "$2")" "$3" >"$1"; }

recorded() {
  local pid="" start="" name=""
  [ -f "$1" ] || return 1
  read -r pid start name <"$1" || true
  [[ $pid =~ ^[0-9]+$ ]] && [ -n "$start" ] && [ "$(started "$pid")" = "$start" ] && [ "$(program "$pid")" = "$name" ] \
    && echo "$pid"
}
