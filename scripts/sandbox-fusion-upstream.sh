#!/bin/bash
# sandbox-fusion-upstream.sh: SandboxFusion's own server (bytedance/SandboxFusion), from a copy of its source tree, on
# this host, for bench/bench_sandbox_fusion.py's `--sandbox-fusion-url` side. Bench-only: never in CI or the tests.
#
#   SANDBOX_FUSION_SRC=/path/to/SandboxFusion scripts/sandbox-fusion-upstream.sh prepare
#   scripts/sandbox-fusion-upstream.sh serve [PORT]    its server on 127.0.0.1:PORT (8080), in the foreground
#
# SANDBOX_FUSION_SRC: a tree (a checkout or `git archive`) of github.com/bytedance/SandboxFusion at 469de08.
# SANDBOX_FUSION_DIR (default ~/.cache/air/sandbox-fusion): where it is set up, never the work tree: a new or empty
# folder, or one this script made (its marker .air-made-by says so), apart from SANDBOX_FUSION_SRC (one inside the
# other is refused before anything is deleted); `prepare` replaces only its src/.
#
# What `prepare` makes there, as upstream's Dockerfile would but without conda: src/ (the copy), a conda-like root
# (condabin/, envs/sandbox for the server with its pyproject's server dependencies, envs/sandbox-runtime a plain
# venv for the programs it runs) and bin/activate NAME, the one conda command upstream calls (runners/major.py finds
# the root by its condabin/ and runs `source ROOT/bin/activate sandbox-runtime && which python`). The config is
# upstream's own local.yaml: `isolation: none`. `serve` runs with HOME set to an empty folder: bash reads ~/.bashrc
# when its stdin is a socket (asyncio's subprocesses), and a .bashrc that runs `pyenv init` made every program run
# through pyenv's shims (2-5 requests a second, experiments.md session 53).
set -euo pipefail

W=${SANDBOX_FUSION_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/air/sandbox-fusion}
# The server's dependencies from upstream's pyproject.toml at 469de08 (the poetry group, not dev), as pip ranges
SERVER_DEPS=("pydantic>=2.4.0,<2.7.0" "fastapi>=0.103.1,<0.104" "uvicorn[standard]==0.25.0" "structlog>=23.1,<24"
  "psutil>=5.9.8,<6" "aiofiles>=23.2.1,<24" "aiohttp>=3.9.5,<4" "tenacity>=8.4.2,<9"
  "databases[aiosqlite]>=0.9,<0.10" "transformers>=4.44.0,<5" "pyyaml")

say() { echo "sandbox-fusion-upstream: $*" >&2; }
# shellcheck source=owned.sh source-path=SCRIPTDIR
. "$(dirname "$0")/owned.sh"
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

prepare() {
  local src=${SANDBOX_FUSION_SRC:-}
  [ -n "$src" ] || { say "set SANDBOX_FUSION_SRC to a tree of github.com/bytedance/SandboxFusion (469de08)"; exit 2; }
  [ -f "$src/sandbox/server/server.py" ] || { say "SANDBOX_FUSION_SRC=$src is not SandboxFusion's tree"; exit 2; }
  apart SANDBOX_FUSION_SRC "$src" SANDBOX_FUSION_DIR "$W"
  claimable "$W" sandbox-fusion-upstream.sh
  command -v python3.11 >/dev/null || { say "upstream needs Python 3.11 (python3.11 is not on PATH)"; exit 2; }
  claim "$W" sandbox-fusion-upstream.sh
  mkdir -p "$W/condabin" "$W/envs" "$W/bin" "$W/home"
  wipe "$W" sandbox-fusion-upstream.sh "$W/src" && cp -a "$src" "$W/src"
  mkdir -p "$W/src/docs/build"  # the server mounts its built docs as static files at start; the API needs none
  [ -x "$W/envs/sandbox/bin/python" ] || python3.11 -m venv "$W/envs/sandbox"
  [ -x "$W/envs/sandbox-runtime/bin/python" ] || python3.11 -m venv "$W/envs/sandbox-runtime"
  "$W/envs/sandbox/bin/python" -m pip install -q "${SERVER_DEPS[@]}"
  # shellcheck disable=SC2016 # $1 and $PATH are the activate script's own, expanded when it is sourced
  printf '# conda activate, as much as SandboxFusion uses: PATH to the named env\nexport PATH="%s/envs/$1/bin:$PATH"\n' \
    "$W" >"$W/bin/activate"
  say "prepared in $W (server: $("$W/envs/sandbox/bin/python" -m pip show fastapi | sed -n 2p), runtime: $("$W/envs/sandbox-runtime/bin/python" --version))"
}

serve() {
  local port=${1:-8080}
  if ! [[ $port =~ ^[0-9]{1,5}$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
    say "PORT must be a number from 1 to 65535, not $port"; exit 2
  fi
  [ -x "$W/envs/sandbox/bin/uvicorn" ] || { say "nothing prepared in $W: run \`$0 prepare\` first"; exit 2; }
  cd "$W/src"
  HOME=$W/home SANDBOX_CONFIG=local exec "$W/envs/sandbox/bin/uvicorn" sandbox.server.server:app \
    --host 127.0.0.1 --port "$port" --log-level warning
}

case ${1:-} in
  -h|--help) usage ;;
  prepare) [ $# -eq 1 ] || { say "prepare takes no argument"; exit 2; }; prepare ;;
  serve) [ $# -le 2 ] || { say "serve takes one argument at most (the port)"; exit 2; }; serve "${2:-}" ;;
  "") say "say a step: prepare or serve (--help says more)"; exit 2 ;;
  *) say "unknown step: $1 (prepare, serve; --help says more)"; exit 2 ;;
esac
