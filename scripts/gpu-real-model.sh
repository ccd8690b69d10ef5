#!/usr/bin/env bash
# The real model's training run on a GPU node (issue 82, docs/learning.md): SmolLM2-135M-Instruct trained with TRL's
# GRPO through air on the GPU, its lr-0 control beside it, then the GPU lease right after a reset
# (tests/test_gpu.py's reset case), on a bare node (no Docker, no network, 64 MiB reaching it at a time).
#   scripts/gpu-real-model.sh --stage     here: the model's GGUF file in parts, the Python 3.12 wheels the training
#                                         needs beyond what the node has, each part under 60 MiB, in
#                                         .gpu-node/real-model/batch-N/ (ignored by git); prints what to carry in
#                                         which call. Docker's binaries: scripts/gpu-node-check.sh --stage (batch 0).
#   scripts/gpu-real-model.sh             there, from the repository root, as root, once every batch has arrived:
#                                         joins and checks the model, installs the wheels beside air's, starts Docker
#                                         as scripts/gpu-node-check.sh does (--keep), runs the training and its
#                                         control (STEPS, default 10, group 4, prisoners-dilemma: its image is the
#                                         node's own root), then the reset case; figures and logs in $OUT.
#   scripts/gpu-real-model.sh --dry-run   here: the node half on this machine's CPU with what --stage made (the
#                                         parts joined and checked, each batch's size, one training step and one
#                                         control step of the carried model file)
#   scripts/gpu-real-model.sh --help      this text
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
R=$PWD
STAGE=$R/.gpu-node/real-model
WHO=gpu-real-model.sh
LIMIT=$((60 * 1024 * 1024))
# What the node lacks for the training (its torch venv has torch, transformers, accelerate, peft, numpy, jinja2):
# TRL and its datasets, OpenEnv's server and client, gguf, and what they import. Pinned to this machine's versions.
NEEDS="trl openenv-core gguf datasets"
HAS="torch transformers accelerate peft numpy jinja2 markupsafe triton sympy mpmath networkx filelock fsspec
  typing-extensions packaging pyyaml requests urllib3 idna certifi charset-normalizer tqdm huggingface-hub safetensors
  tokenizers regex psutil docker tenacity pydantic pydantic-core annotated-types typing-inspection httpx httpcore
  anyio sniffio h11 rich markdown-it-py mdurl pygments typer click shellingham setuptools"

say() { echo "gpu-real-model: $*" >&2; }
# shellcheck source=owned.sh source-path=SCRIPTDIR
. "$(dirname "$0")/owned.sh"

mode=run
for a in "$@"; do
  case $a in
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0;;
    --stage) mode=stage;;
    --dry-run) mode=dry-run;;
    *) say "unknown argument: $a (--stage, --dry-run or none; --help says which)"; exit 2;;
  esac
done
[ $# -le 1 ] || { say "one argument at most (--stage, --dry-run or none), not $*"; exit 2; }
STEPS=${STEPS:-10}
[[ $STEPS =~ ^[1-9][0-9]{0,2}$ ]] || { say "STEPS=$STEPS is not a number of steps from 1 to 999"; exit 2; }

closure() {  # the installed distributions NEEDS pulls in, less what the node has, as name==version
  python3 - "$NEEDS" "$HAS" <<'EOF'
import importlib.metadata as m, re, sys
needs, has = sys.argv[1].split(), {h.lower() for h in sys.argv[2].split()}
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
seen, todo = {}, [norm(n) for n in needs]
while todo:
    name = todo.pop()
    if name in seen or name in has or name.startswith("nvidia-"):
        continue
    try:
        dist = m.distribution(name)
    except m.PackageNotFoundError:
        continue
    seen[name] = dist.version
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        todo.append(norm(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]))
print(" ".join(f"{n}=={v}" for n, v in sorted(seen.items())))
EOF
}

if [ "$mode" = stage ]; then
  claim "$STAGE" "$WHO"
  model=$(python3 -c "from air.model.files import default_model_file; print(default_model_file())") || exit 2
  wipe "$STAGE" "$WHO" "$STAGE"/batch-* "$STAGE"/work
  mkdir -p "$STAGE/work/wheels"
  pins=$(closure) || exit 1
  say "wheels for Python 3.12: $pins"
  for pin in $pins; do  # this machine's version, else (no wheel of it for Python 3.12) the newest that has one
    for want in "$pin" "${pin%%==*}"; do
      python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$STAGE/work/wheels" "$want" >/dev/null 2>&1 && break
      [ "$want" = "$pin" ] || { say "no wheel of ${pin%%==*} for Python 3.12"; exit 1; }
      say "no Python 3.12 wheel of $pin: taking the newest that has one"
    done
  done
  split -b 47M -d "$model" "$STAGE/work/model.gguf.part-"
  sha256sum "$model" | awk '{print $1}' >"$STAGE/work/model.gguf.sha256"
  # Into batches of at most 60 MiB, largest first: each batch travels in one call.
  n=1 size=0
  mkdir -p "$STAGE/batch-$n"
  while read -r bytes file; do
    if [ $((size + bytes)) -gt "$LIMIT" ] && [ "$size" -gt 0 ]; then n=$((n + 1)) size=0; mkdir -p "$STAGE/batch-$n"; fi
    mv -- "$file" "$STAGE/batch-$n/"
    size=$((size + bytes))
  done < <(find "$STAGE/work" -type f -printf '%s %p\n' | sort -rn)
  wipe "$STAGE" "$WHO" "$STAGE/work"
  say "staged: carry .gpu-node/ (scripts/gpu-node-check.sh --stage: Docker's binaries) in one call, then each of:"
  for b in "$STAGE"/batch-*; do du -sh "$b" | sed "s|$R/||"; done
  exit 0
fi

owned "$STAGE" "$WHO" || { say "no $STAGE: run scripts/gpu-real-model.sh --stage first"; exit 2; }
if [ "$mode" = run ] && ! command -v nvidia-smi >/dev/null && ! [ -e /dev/nvidia0 ]; then
  say "this host has no GPU (no nvidia-smi, no /dev/nvidia0): run it on a GPU node (--dry-run runs here)"
  exit 2
fi
OUT=${OUT:-$R/gpu-node-out/real-model}
mkdir -p "$OUT" || exit 2
T=$(mktemp -d "${TMPDIR:-/tmp}/air-real-model.XXXXXX")
start=$SECONDS
step() { echo; echo "== $* (at $((SECONDS - start)) s)"; }
exec > >(tee -a "$OUT/run.log") 2>&1

step "the model, joined from its parts and checked"
for b in "$STAGE"/batch-*; do
  [ "$(du -sb "$b" | cut -f1)" -le "$LIMIT" ] || { say "$b is over 60 MiB: it cannot travel in one call"; exit 1; }
done
cat "$STAGE"/batch-*/model.gguf.part-* >"$T/SmolLM2-135M-Instruct.Q4_1.gguf"
echo "$(cat "$STAGE"/batch-*/model.gguf.sha256)  $T/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c - || exit 1

if [ "$mode" = dry-run ]; then
  step "one training step and one control step on this CPU, from the joined file"
  export AIR_CACHE_DIR=$T/cache
  for lr in 2e-5 0; do
    timeout 1800 python3 examples/grpo_real_model.py --model-file "$T/SmolLM2-135M-Instruct.Q4_1.gguf" \
      --task prisoners-dilemma --steps 1 --group 2 --max-turns 2 --max-tokens 24 --device cpu --lr "$lr" \
      --out "$T/run-lr$lr" | tail -2 || exit 1
  done
  rm -rf -- "$T"
  say "dry run passed in $((SECONDS - start)) s"
  exit 0
fi

PY=/opt/torch/.venv/bin/python3
step "the wheels beside air's (scripts/gpu-node-check.sh --stage staged Docker's and air's own)"
mkdir -p "$T/site"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$T/site" "$STAGE"/batch-*/*.whl \
  "$R"/.gpu-node/wheels/*.whl || exit 1
export PYTHONPATH=$R:$T/site
step "Docker, air/gpu (as air/cpu: prisoners-dilemma needs only Python), GPU tests' reset case"
OUT=$OUT/check timeout 400 scripts/gpu-node-check.sh --keep >/dev/null 2>&1
export DOCKER_HOST=unix:///tmp/air-gpu/docker.sock
"$PY" -c "import docker; c = docker.from_env(); c.images.get('air/gpu:latest').tag('air/cpu', 'latest')" || exit 1
timeout 200 "$PY" -m pytest -q -n0 -m gpu -p no:cacheprovider tests/test_gpu.py -k reset 2>&1 | tail -5
for lr in 2e-5 0; do
  step "prisoners-dilemma, $STEPS steps, lr $lr, the model on the GPU"
  timeout 420 "$PY" examples/grpo_real_model.py --model-file "$T/SmolLM2-135M-Instruct.Q4_1.gguf" \
    --task prisoners-dilemma --steps "$STEPS" --seed 0 --lr "$lr" --device cuda --out "$OUT/prisoners-dilemma-lr$lr" \
    | tail -"$((STEPS + 1))"
done
say "done in $((SECONDS - start)) s; steps.jsonl files under $OUT"
