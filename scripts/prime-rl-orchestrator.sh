#!/bin/bash
# prime-rl-orchestrator.sh: prime-rl's own orchestrator (github.com/PrimeIntellect-ai/prime-rl at 559b447,
# unmodified) in a virtual environment of its own on a machine without a GPU, to drive rollouts of a local model
# (`air serve model`) through air's taskset (docs/prime-rl.md, "prime-rl's orchestrator on a CPU with a local model").
# Not part of CI: CI has no copy of prime-rl's sources, so tests/test_prime_rl_orchestrator.py skips there and says so.
#
#   PRIME_RL_SRC=... VERIFIERS_SRC=... TORCHTITAN_SRC=... scripts/prime-rl-orchestrator.sh prepare
#   scripts/prime-rl-orchestrator.sh check                  the orchestrator imports; the stubs are only stubs
#   scripts/prime-rl-orchestrator.sh validate FILE [ARG...]  an orchestrator config, read by prime-rl's own parser
#   scripts/prime-rl-orchestrator.sh run PROGRAM [ARG...]    a program of the environment (orchestrator, python),
#                                                            with the stubs on its PYTHONPATH and HF_HUB_OFFLINE=1
#   scripts/prime-rl-orchestrator.sh env                    prints `export PRIME_RL_ORCHESTRATOR_DIR=...`
#
# Each source is a git repository holding the pinned commit (a clone or a bare mirror: the commit is exported with
# `git archive`, whatever is checked out), or a tree of that commit (a `git archive`, copied as it is):
#   PRIME_RL_SRC    github.com/PrimeIntellect-ai/prime-rl at 559b447
#   VERIFIERS_SRC   github.com/PrimeIntellect-ai/verifiers at a60a606 (prime-rl's deps/verifiers submodule; by
#                   default PRIME_RL_SRC/deps/verifiers where a checkout has it)
#   TORCHTITAN_SRC  github.com/pytorch/torchtitan at 23e4dfc (prime-rl's pin in its pyproject.toml)
# PRIME_RL_ORCHESTRATOR_DIR (default ~/.cache/air/prime-rl): where everything goes (src/, venv/, stubs/), never the
# work tree: a new or empty folder, or one this script made (its marker .air-made-by says so), apart from the
# sources; `prepare` replaces only its src/ and stubs/ and installs into its venv/.
# PRIME_RL_PYTHON (default python3.11): the interpreter of the environment. prime-rl asks for 3.12; 3.11 is taken
# because the CPU build of torch 2.13.0 (`torch==2.13.0+cpu`, from a local wheel folder or PyTorch's CPU index in
# pip's configuration) may exist only for it; every file of prime-rl and verifiers at these commits compiles on it.
#
# What is not prime-rl's: renderers 0.1.10.dev4 from PyPI (prime-rl's deps/renderers at 2846a3d is not released; it
# is the first release with what that commit added, and the last one with what verifiers a60a606 reads), the
# versions of everything else in scripts/prime-rl-orchestrator-constraints.txt (prime-rl's uv.lock where it pins
# them), and two STUB packages, generated into stubs/: `vllm` (the two classes transports/weights/nccl.py imports)
# and `ring_flash_attn` (the one function utils/cp.py imports; the real one needs flash_attn, which needs CUDA). The
# orchestrator imports both at start-up and never uses them with a filesystem weight broadcast; every stubbed object
# raises if it is ever used. They go on the PYTHONPATH of the programs `run` starts only, never on air's.
set -euo pipefail

W=${PRIME_RL_ORCHESTRATOR_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/air/prime-rl}
PY=${PRIME_RL_PYTHON:-python3.11}
HERE=$(cd "$(dirname "$0")" && pwd)
AIR=$(dirname "$HERE")
CONSTRAINTS=$HERE/prime-rl-orchestrator-constraints.txt
PRIME_RL_COMMIT=559b44772e471d1538537b8805cc77f3824a5e64
VERIFIERS_COMMIT=a60a606ecc4d309247edf9ff92c3eabca362781f
VERIFIERS_VERSION=0.3.1.dev62  # `git describe` of a60a606 (v0.3.0-62): an exported tree has no history to read
TORCHTITAN_COMMIT=23e4dfca5ca52587dbaf18f67bee8d73e875df5b
TORCHTITAN_PATHS=(torchtitan pyproject.toml assets/version.txt README.md LICENSE)  # what its wheel is built from
TORCH='torch==2.13.0+cpu'
WHO='prime-rl-orchestrator.sh'

say() { echo "prime-rl-orchestrator: $*" >&2; }
# shellcheck source=owned.sh source-path=SCRIPTDIR
. "$HERE/owned.sh"
usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

is_git() { [ -e "$1/.git" ] || { [ -f "$1/HEAD" ] && [ -d "$1/objects" ]; }; }

# source VAR PATH COMMIT WHAT MARKER...: "" when PATH is a usable source, else what is wrong with it (one phrase)
source_problem() {
  local var=$1 path=$2 commit=$3 what=$4 marker
  shift 4
  if [ -z "$path" ]; then echo "$var (a clone or tree of $what)"; return; fi
  if [ ! -d "$path" ]; then echo "$var=$path (no such folder; a clone or tree of $what)"; return; fi
  if is_git "$path"; then
    git -C "$path" cat-file -e "$commit^{commit}" 2>/dev/null \
      || echo "$var=$path (a git repository without commit ${commit:0:7} of $what: fetch it)"
    return
  fi
  for marker in "$@"; do
    [ -e "$path/$marker" ] || { echo "$var=$path (not a tree of $what: no $marker)"; return; }
  done
}

# export_source PATH COMMIT DEST [PATHS...]: the commit's files (or the tree's) into DEST, which is new
export_source() {
  local path=$1 commit=$2 dest=$3
  shift 3
  mkdir -p "$dest"
  if is_git "$path"; then
    # A mirror may lack blobs of files outside the paths asked for (torchtitan's test assets are in Git LFS): git
    # names them on stderr yet exports what was asked; its stderr is shown when the export fails.
    local errors
    errors=$(mktemp)
    if ! git -C "$path" archive "$commit" "$@" 2>"$errors" | tar -x -C "$dest"; then
      cat "$errors" >&2; rm -f -- "$errors"
      say "could not export ${commit:0:7} from $path"; exit 1
    fi
    rm -f -- "$errors"
  elif [ $# -gt 0 ]; then
    (cd "$path" && cp -a --parents "$@" "$dest/")
  else
    cp -a "$path/." "$dest/"
  fi
}

prepare() {
  local prime=${PRIME_RL_SRC:-} verifiers=${VERIFIERS_SRC:-} torchtitan=${TORCHTITAN_SRC:-} missing=() problem
  if [ -z "$verifiers" ] && [ -n "$prime" ] && [ -f "$prime/deps/verifiers/pyproject.toml" ]; then
    verifiers=$prime/deps/verifiers
  fi
  problem=$(source_problem PRIME_RL_SRC "$prime" "$PRIME_RL_COMMIT" "github.com/PrimeIntellect-ai/prime-rl at 559b447" \
    src/prime_rl/orchestrator/orchestrator.py packages/prime-rl-configs/pyproject.toml)
  [ -z "$problem" ] || missing+=("$problem")
  problem=$(source_problem VERIFIERS_SRC "$verifiers" "$VERIFIERS_COMMIT" \
    "github.com/PrimeIntellect-ai/verifiers at a60a606" verifiers/v1/__init__.py pyproject.toml)
  [ -z "$problem" ] || missing+=("$problem")
  problem=$(source_problem TORCHTITAN_SRC "$torchtitan" "$TORCHTITAN_COMMIT" "github.com/pytorch/torchtitan at 23e4dfc" \
    "${TORCHTITAN_PATHS[@]}")
  [ -z "$problem" ] || missing+=("$problem")
  local version
  if ! version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
    missing+=("PRIME_RL_PYTHON=$PY (no such interpreter)")
  elif [ "$version" != 3.11 ] && [ "$version" != 3.12 ]; then
    missing+=("PRIME_RL_PYTHON=$PY (Python $version: 3.11 or 3.12)")
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    local joined
    joined=$(printf '; %s' "${missing[@]}")
    say "missing: ${joined#; }"
    exit 2
  fi
  apart PRIME_RL_SRC "$prime" PRIME_RL_ORCHESTRATOR_DIR "$W"
  apart VERIFIERS_SRC "$verifiers" PRIME_RL_ORCHESTRATOR_DIR "$W"
  apart TORCHTITAN_SRC "$torchtitan" PRIME_RL_ORCHESTRATOR_DIR "$W"
  claimable "$W" "$WHO"
  if [ ! -f "$AIR/pyproject.toml" ] || [ ! -d "$AIR/air_mlgym" ]; then say "$AIR is not air's checkout"; exit 2; fi

  claim "$W" "$WHO"
  wipe "$W" "$WHO" "$W/src"
  export_source "$prime" "$PRIME_RL_COMMIT" "$W/src/prime-rl"
  export_source "$verifiers" "$VERIFIERS_COMMIT" "$W/src/verifiers"
  export_source "$torchtitan" "$TORCHTITAN_COMMIT" "$W/src/torchtitan" "${TORCHTITAN_PATHS[@]}"
  say "sources in $W/src"

  [ -x "$W/venv/bin/python" ] || "$PY" -m venv "$W/venv"
  local pip=("$W/venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" "$TORCH"  # never a plain `torch`: PyPI's is the CUDA build, with gigabytes of nvidia-* wheels
  # The pinned source packages, without their dependency lists (prime-rl's are a GPU node's)
  SETUPTOOLS_SCM_PRETEND_VERSION=$VERIFIERS_VERSION "${pip[@]}" --no-deps --force-reinstall "$W/src/verifiers"
  "${pip[@]}" --no-deps --force-reinstall --ignore-requires-python "$W/src/prime-rl/packages/prime-rl-configs" \
    "$W/src/prime-rl"
  "${pip[@]}" --no-deps --force-reinstall "$W/src/torchtitan"
  "${pip[@]}" --no-deps renderers==0.1.10.dev4 modelexpress==0.3.0 flash-linear-attention==0.5.2 fla-core==0.5.2 \
    torchao==0.17.0
  # What the orchestrator's imports, verifiers and renderers need
  "${pip[@]}" -c "$CONSTRAINTS" aiohttp aiolimiter anthropic datasets gepa httpx loguru math-verify mcp msgpack numpy \
    openai-agents openai "prime-pydantic-config[toml]" prime-sandboxes prime-tunnel pydantic pyzmq requests rich \
    setproctitle tenacity tomli-w typing-extensions uvloop jinja2 openai-harmony tiktoken transformers tomli msgspec \
    orjson jaxtyping safetensors prometheus-client psutil grpcio protobuf wandb wandb-workspaces prime tyro torchdata \
    tensorboard triton einops nvidia-ml-py
  # air, editable and without its dependency list (it pins verifiers 0.4.0; prime-rl's is a60a606), then the rest
  # of what air's env server needs
  "${pip[@]}" --no-deps -e "$AIR"
  "${pip[@]}" -c "$CONSTRAINTS" docker pyyaml typer fastapi uvicorn httptools
  stubs
  say "prepared in $W ($("$W/venv/bin/python" --version))"
  check
}

stub_module() {  # FILE DOC: a stub module's head: its docstring, the raising helpers, no other name importable
  cat >"$1" <<EOF
"""CPU STUB, not the real package (generated by air's scripts/prime-rl-orchestrator.sh). $2
Every object here raises if it is used; any other name is absent."""

AIR_CPU_STUB = True


def _refuse(what):
    raise RuntimeError(f"{what} is air's CPU stub of a CUDA-only package (scripts/prime-rl-orchestrator.sh): "
                       "prime-rl's orchestrator must never use it (weight_broadcast.type = 'filesystem')")


def __getattr__(name):
    raise AttributeError(f"{__name__}.{name} is not in air's CPU stub (scripts/prime-rl-orchestrator.sh): only "
                         "what prime-rl's orchestrator imports at start-up is")
EOF
}

stub_class() {  # FILE NAME: a class that raises when made
  printf '\n\nclass %s:\n    def __init__(self, *args, **kwargs):\n        _refuse("%s")\n' "$2" "$2" >>"$1"
}

stubs() {
  wipe "$W" "$WHO" "$W/stubs"
  mkdir -p "$W/stubs/vllm/distributed/device_communicators" "$W/stubs/ring_flash_attn"
  cat >"$W/stubs/README.md" <<'EOF'
CPU STUBS of two CUDA-only packages, generated by air's scripts/prime-rl-orchestrator.sh: not the real `vllm` and
`ring_flash_attn`. prime-rl's orchestrator (559b447) imports them at start-up and never uses them with a filesystem
weight broadcast; every object here raises if used, and any other name is absent.
  vllm            prime_rl/transports/weights/nccl.py:11-12 (PyNcclCommunicator, StatelessProcessGroup), reached from
                  orchestrator/orchestrator.py through prime_rl/transports/weights/__init__.py
  ring_flash_attn prime_rl/utils/cp.py:12 (update_ring_flash_attn_params), reached from orchestrator/orchestrator.py
                  through prime_rl.trainer.model; the real package imports flash_attn, which has no CPU build
Only on the PYTHONPATH of the programs `scripts/prime-rl-orchestrator.sh run` starts.
EOF
  stub_module "$W/stubs/vllm/__init__.py" "vLLM: only the names prime_rl/transports/weights/nccl.py imports."
  stub_module "$W/stubs/vllm/distributed/__init__.py" "vllm.distributed"
  stub_module "$W/stubs/vllm/distributed/device_communicators/__init__.py" "vllm.distributed.device_communicators"
  stub_module "$W/stubs/vllm/distributed/device_communicators/pynccl.py" "vllm's NCCL communicator."
  stub_class "$W/stubs/vllm/distributed/device_communicators/pynccl.py" PyNcclCommunicator
  stub_module "$W/stubs/vllm/distributed/utils.py" "vllm.distributed.utils"
  stub_class "$W/stubs/vllm/distributed/utils.py" StatelessProcessGroup
  stub_module "$W/stubs/ring_flash_attn/__init__.py" "ring-flash-attn: only what prime_rl/utils/cp.py imports."
  printf '\n\ndef update_ring_flash_attn_params(*args, **kwargs):\n    _refuse("update_ring_flash_attn_params")\n' \
    >>"$W/stubs/ring_flash_attn/__init__.py"
}

prepared() { [ -x "$W/venv/bin/orchestrator" ] && [ -f "$W/stubs/README.md" ] && owned "$W" "$WHO"; }
need_prepared() { prepared || { say "nothing prepared in $W: run \`$0 prepare\` first"; exit 1; }; }

with_stubs() {  # PROGRAM [ARG...]: a program of the environment, the stubs on its PYTHONPATH alone
  PYTHONPATH="$W/stubs${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} "$W/venv/bin/$1" "${@:2}"
}

check() {
  need_prepared
  with_stubs python - <<'EOF'
import importlib

import prime_rl.orchestrator.orchestrator  # noqa: F401 - what `orchestrator` imports once its config is read
import air_mlgym.taskset  # noqa: F401
import verifiers
for name in ("vllm", "ring_flash_attn", "vllm.distributed.utils"):
    assert getattr(importlib.import_module(name), "AIR_CPU_STUB", False), f"{name} is not air's stub"
from vllm.distributed.utils import StatelessProcessGroup
try:
    StatelessProcessGroup()
except RuntimeError:
    pass
else:
    raise AssertionError("a stub did not refuse to be used")
print(f"prime-rl's orchestrator imports (verifiers {verifiers.__version__}); vllm and ring_flash_attn are stubs")
EOF
  with_stubs orchestrator --help >/dev/null
}

validate() {
  local file=${1:-}
  [ -n "$file" ] || { say "validate takes an orchestrator config file"; exit 2; }
  [ -f "$file" ] || { say "no such file: $file"; exit 2; }
  need_prepared
  with_stubs python - "$@" <<'EOF'
import sys

from prime_rl.configs.orchestrator import OrchestratorConfig
from prime_rl.utils.config import cli

try:
    config = cli(OrchestratorConfig, args=["@", *sys.argv[1:]])
except Exception as exc:  # noqa: BLE001 - prime-pydantic-config's ConfigFileError, pydantic's ValidationError
    said = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    print(f"prime-rl-orchestrator: {sys.argv[1]} is not a valid OrchestratorConfig: {said}", file=sys.stderr)
    sys.exit(2)
sources = ", ".join(f"{s.name} (group {s.group_size})" for s in config.train.source)
print(f"{sys.argv[1]}: a valid OrchestratorConfig: model {config.model.name} at {config.model.client.base_url}, "
      f"{config.max_steps} steps of {config.batch_size} rollouts, sources {sources}, "
      f"weights by {config.weight_broadcast.type}, output {config.output_dir}")
EOF
}

env_() { need_prepared; printf 'export PRIME_RL_ORCHESTRATOR_DIR=%q\n' "$W"; }

case ${1:-} in
  -h|--help) usage ;;
  prepare) [ $# -eq 1 ] || { say "prepare takes no argument"; exit 2; }; prepare ;;
  check) [ $# -eq 1 ] || { say "check takes no argument"; exit 2; }; check ;;
  env) [ $# -eq 1 ] || { say "env takes no argument"; exit 2; }; env_ ;;
  validate) shift; validate "$@" ;;
  run)
    [ $# -ge 2 ] || { say "run takes a program of the environment (orchestrator, python, ...)"; exit 2; }
    case $2 in */*|.*|"") say "run takes a program's name, not a path: $2"; exit 2;; esac
    need_prepared
    [ -x "$W/venv/bin/$2" ] || { say "$W/venv/bin has no program $2"; exit 2; }
    PYTHONPATH="$W/stubs${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} exec "$W/venv/bin/$2" "${@:3}" ;;
  "") say "say a step: prepare, check, validate, run or env (--help says more)"; exit 2 ;;
  *) say "unknown step: $1 (prepare, check, validate, run, env; --help says more)"; exit 2 ;;
esac
