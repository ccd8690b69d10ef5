#!/usr/bin/env bash
# The GPU node check: air on a bare GPU node (no Docker, no NVIDIA toolkit, no network), end to end, in at most nine
# minutes. Two halves:
#   scripts/gpu-node-check.sh --stage   here, on a machine with the set-up's Docker engine and PyPI: the daemon's
#                                       binaries (xz) and the Python 3.12 wheels air needs beyond what the node has,
#                                       into .gpu-node/ (ignored by git; about 45 MB: it travels with the tree)
#   scripts/gpu-node-check.sh           there, from the repository root, as root: starts Docker from those binaries
#                                       with CDI on and air's own spec (air/sandbox/gpus.py cdi-spec), makes air/gpu
#                                       offline from the node's own root and its torch venv, runs the GPU-marked
#                                       tests (tests/test_gpu_node.py) and one scripted episode of the GPU task, and
#                                       prints a summary. Logs go to $OUT (else ./gpu-node-out). Run again on the
#                                       same machine, it reuses the daemon and air/gpu it left (`--keep` leaves the
#                                       daemon running: a second run then costs only the tests and the episode).
#   scripts/gpu-node-check.sh --help    this text
# An earlier check's logs in $OUT are kept (check.log becomes check.log.1, ...), never written over. On a host with
# no GPU the check says so in one line and does nothing.
# The node's facts (torch in /opt/torch/.venv, the driver in /usr/local/nvidia): ../shared/reference/gpu-node.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
R=$PWD
STAGE=$R/.gpu-node
BINARIES="dockerd containerd containerd-shim-runc-v2 runc docker-init"
WHEELS="docker tenacity pydantic pydantic-core annotated-types typing-inspection pytest-asyncio"

say() { echo "gpu-node-check: $*" >&2; }
# Every argument checked before anything is done
mode=check
for a in "$@"; do
  case $a in
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0;;
    --stage) mode=stage;;
    --keep) mode=keep;;
    *) say "unknown argument: $a (--stage, --keep or none; --help says which)"; exit 2;;
  esac
done
[ $# -le 1 ] || { say "one argument at most (--stage, --keep or none), not $*"; exit 2; }

if [ "$mode" = stage ]; then
  mkdir -p "$STAGE/wheels"
  for b in $BINARIES; do
    path=$(readlink -f "$(command -v "$b")") || { echo "gpu-node-check: $b not found (run scripts/setup.sh)"; exit 2; }
    [ -s "$STAGE/$b.xz" ] || xz -T0 -9 -c "$path" >"$STAGE/$b.xz"
  done
  # shellcheck disable=SC2086
  pins=$(python3 -c "import importlib.metadata as m, sys; print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" \
    $WHEELS) || exit 1
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$STAGE/wheels" $pins || exit 1
  du -sh "$STAGE"
  exit 0
fi

keep=false
[ "$mode" = keep ] && keep=true
# The check is for a GPU node: on any other host it would unpack Docker into /tmp and fail at nvidia-smi
if ! command -v nvidia-smi >/dev/null && ! [ -e /dev/nvidia0 ] && ! [ -e /dev/nvidiactl ]; then
  say "this host has no GPU (no nvidia-smi, no /dev/nvidia0): run the check on a GPU node (--stage runs here)"
  exit 2
fi
OUT=${OUT:-$R/gpu-node-out}
mkdir -p "$OUT" || exit 2
for f in check.log dockerd.log tar.err tests.log episode.log; do  # an earlier check's logs are kept, never replaced
  [ -e "$OUT/$f" ] || continue
  n=1; while [ -e "$OUT/$f.$n" ]; do n=$((n + 1)); done
  mv -- "$OUT/$f" "$OUT/$f.$n" && say "kept the earlier $OUT/$f as $f.$n"
done
exec > >(tee "$OUT/check.log") 2>&1
T=/tmp/air-gpu
PY=/opt/torch/.venv/bin/python3
[ -x "$PY" ] || PY=python3
start=$SECONDS
stage() { echo; echo "== $* (at $((SECONDS - start)) s)"; }

stage "the node"
nvidia-smi -L; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
"$PY" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.is_available())"
command -v nvidia-ctk nvidia-container-runtime-hook || echo "no NVIDIA container toolkit"

stage "Docker from the staged binaries"
[ -d "$STAGE" ] || { echo "gpu-node-check: no $STAGE (run scripts/gpu-node-check.sh --stage first)"; exit 2; }
mkdir -p "$T/bin" "$T/cdi" "$T/data" "$T/exec" "$T/site"
unpacking=()
for b in $BINARIES; do xz -dc "$STAGE/$b.xz" >"$T/bin/$b" & unpacking+=($!); done
wait "${unpacking[@]}"  # by pid: a bare `wait` also waits for the log's tee, which never ends
chmod +x "$T/bin"/*
export PATH=$T/bin:$PATH
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$T/site" "$STAGE"/wheels/*.whl || exit 1
export PYTHONPATH=$R:$T/site
"$PY" air/sandbox/gpus.py cdi-spec "$T/cdi/air-nvidia.json" || exit 1
export DOCKER_HOST=unix://$T/docker.sock
if ! "$PY" -c "import docker; docker.from_env().ping()" 2>/dev/null; then
  echo "{\"features\": {\"cdi\": true}, \"cdi-spec-dirs\": [\"$T/cdi\"]}" >"$T/daemon.json"
  setsid dockerd --config-file "$T/daemon.json" --iptables=false --ip6tables=false --bridge=none \
    --userland-proxy=false --data-root "$T/data" --exec-root "$T/exec" --pidfile "$T/dockerd.pid" \
    -H "unix://$T/docker.sock" >"$OUT/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 120); do "$PY" -c "import docker; docker.from_env().ping()" 2>/dev/null && break; sleep 0.25; done
fi
"$PY" -c "import docker; i = docker.from_env().info(); print('dockerd', i['ServerVersion'], 'CDI', i.get('CDISpecDirs'), \
'runtimes', sorted(i['Runtimes']))" || { tail -20 "$OUT/dockerd.log"; exit 1; }
our_dockerd() {  # the pid in $T/dockerd.pid, when it is a dockerd started with that pid file (a stale file's pid,
  local pid     # since reused by another process, is not ours to end)
  pid=$(cat "$T/dockerd.pid" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] \
    && tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF "$T/dockerd.pid" \
    && [ "$(basename "$(head -z -n 1 "/proc/$pid/cmdline" | tr -d '\0')")" = dockerd ] && echo "$pid"
}
$keep || trap 'pid=$(our_dockerd) && kill "$pid" 2>/dev/null' EXIT

stage "air/gpu, offline, from the node's root and its torch venv"
if ! "$PY" -c "import docker; docker.from_env().images.get('air/gpu:latest')" 2>/dev/null; then
venv=$(dirname "$(dirname "$PY")")
interp=$(dirname "$(dirname "$(readlink -f "$PY")")")
site=$(cd "$venv" && ls -d lib/python3*/site-packages)
keep="torch torchgen functorch nvidia triton numpy numpy.libs sympy mpmath networkx filelock fsspec jinja2 markupsafe \
typing_extensions.py"
parts=()
for k in $keep; do [ -e "$venv/$site/$k" ] && parts+=("${venv#/}/$site/$k"); done
for d in "$venv/$site"/*.dist-info; do
  case "$(basename "$d" | tr 'A-Z_' 'a-z-')" in torch-*|nvidia-*|triton-*|numpy-*|sympy-*|mpmath-*|networkx-*|\
    filelock-*|fsspec-*|jinja2-*|markupsafe-*|typing-extensions-*) parts+=("${d#/}") ;; esac
done
# The system's programs, libraries and Python, not its documentation, compilers' static archives or any CUDA
# (the driver's files are bound in by air; torch brings its own CUDA libraries).
roots=(etc usr/bin usr/sbin usr/lib64 usr/libexec usr/lib/os-release usr/share/zoneinfo usr/share/terminfo
  "${venv#/}/bin" "${venv#/}/pyvenv.cfg")
for d in /usr/lib/x86_64-linux-gnu /usr/lib/python3* /usr/lib/locale /usr/lib/ssl; do [ -e "$d" ] && roots+=("${d#/}"); done
case "$interp" in /usr|/usr/*) ;; *) roots+=("${interp#/}") ;; esac
du -sch "${roots[@]/#//}" "${parts[@]/#//}" 2>/dev/null | sort -h | tail -6
t0=$SECONDS
# The node has no docker client: the SDK streams the tar to the daemon.
tar -C / --numeric-owner -cf - --exclude='usr/lib/x86_64-linux-gnu/libcu*' --exclude='usr/lib/x86_64-linux-gnu/libnv*' \
  --exclude='usr/lib/x86_64-linux-gnu/libnccl*' --exclude='usr/lib/x86_64-linux-gnu/*.a' \
  --exclude='usr/lib/x86_64-linux-gnu/dri' --exclude='*/site-packages/torch/include' --exclude='*/nvidia/*/include' \
  --exclude='usr/lib/python3*/test' --exclude=etc/ld.so.cache \
  "${roots[@]}" "${parts[@]}" bin lib lib64 sbin 2>"$OUT/tar.err" \
  | "$PY" -c "import docker, sys; print(docker.from_env(timeout=600).api.import_image_from_stream(sys.stdin.buffer, \
repository='air/gpu-root', tag='node'))" | tail -c 300
echo "imported in $((SECONDS - t0)) s"
mkdir -p "$T/ctx"
cat >"$T/ctx/Dockerfile" <<EOF
FROM air/gpu-root:node
RUN mkdir -p /home /root /var/tmp /tmp /opt && u=\$(getent passwd 1000 | cut -d: -f1); if [ -n "\$u" ] && [ "\$u" != agent ]; then userdel "\$u" 2>/dev/null; \
    groupdel "\$u" 2>/dev/null; fi; (getent passwd agent || useradd --create-home --uid 1000 --user-group \
    --shell /bin/bash agent) && mkdir -p /home/agent/workspace /srv/air/etc /tmp /var/tmp && chmod 1777 /tmp /var/tmp \
 && chown -R agent:agent /home/agent && ln -sfn $venv /opt/venv && rm -f /home/agent/.bash_logout && ldconfig \
 && for f in passwd group; do cp /etc/\$f /srv/air/etc/\$f && ln -sf /srv/air/etc/\$f /etc/\$f; done
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONUNBUFFERED=1 PIP_NO_INDEX=1 \
    LANG=C.UTF-8
WORKDIR /home/agent/workspace
CMD ["sleep", "infinity"]
EOF
"$PY" - "$T/ctx" <<'EOF' || exit 1
import sys, docker
client = docker.from_env(timeout=600)
image, _ = client.images.build(path=sys.argv[1], tag="air/gpu:latest", network_mode="none", rm=True)
image.tag("air/base", "latest")
print("air/gpu", image.short_id, f"{image.attrs['Size'] / 1e9:.1f} GB")
EOF
echo "air/gpu built at $((SECONDS - start)) s"
else
  echo "air/gpu is there from an earlier run"
fi

stage "air doctor"
timeout 60 "$PY" -m air.cli.main doctor --json 2>&1 | "$PY" -c "import json, sys
for row in json.load(sys.stdin):
    if 'GPU' in row.get('name', '') or row.get('name') == 'docker daemon':
        print(row.get('name'), '|', row.get('ok'), '|', row.get('detail'), '|', row.get('fix', ''))"

stage "the GPU-marked tests"
timeout 330 "$PY" -m pytest -q -n0 -s -m gpu -p no:cacheprovider tests/test_gpu_node.py 2>&1 | tee "$OUT/tests.log" \
  | grep -E "GPU-CHECK|passed|failed|Error|error|assert"

stage "one scripted episode of the GPU task"
timeout 150 "$PY" -m air.cli.main run --task gpu-cnn-speedrun 2>&1 | tee "$OUT/episode.log" | tail -40

stage "what an enroot run would find here (facts only: air's enroot backend is not run on this node)"
for p in enroot mksquashfs unsquashfs newuidmap newgidmap; do printf '%s: %s\n' "$p" "$(command -v "$p" || echo absent)"; done
for f in /proc/sys/user/max_user_namespaces /proc/sys/kernel/unprivileged_userns_clone \
  /proc/sys/kernel/apparmor_restrict_unprivileged_userns; do
  [ -e "$f" ] && echo "$f = $(cat "$f")"
done
if id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null; then
  echo "an ordinary user's user namespace: $(timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups \
    unshare --user --map-root-user --net --pid --fork --mount sh -c 'id -u; ls /sys/class/net | tr "\n" " "' 2>&1 | tr '\n' ' ')"
fi

stage "summary"
grep -h "GPU-CHECK" "$OUT/tests.log" | sed 's/^.*GPU-CHECK /- /'
tail -3 "$OUT/tests.log" | grep -E "passed|failed|skipped" || true
grep -iE "reward|score|return" "$OUT/episode.log" | tail -8
echo "gpu-node-check: done in $((SECONDS - start)) s"
