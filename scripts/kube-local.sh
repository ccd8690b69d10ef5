#!/bin/bash
# kube-local.sh: a real one-node Kubernetes cluster on this machine, for running air's Kubernetes tests against a
# real API server and kubelet (docs/kubernetes.md, "A one-node cluster"). Not part of CI: it needs a mirror of
# github.com/openshift/microshift, whose deps/ tree vendors a complete Kubernetes (v1.34.2 at $COMMIT) that builds
# with no network (GOPROXY=off, -mod=vendor) with Debian trixie's golang-1.24; a mirror of kubernetes/kubernetes
# itself is 1.9 GB, microshift's 249 MB.
#
#   KUBE_LOCAL_MIRROR=/path/to/microshift.git scripts/kube-local.sh up    deps src build gvisor pki start images air-setup
#   KUBE_LOCAL_GVISOR_MIRROR=/path/to/gvisor.git scripts/kube-local.sh gvisor    gVisor's shim and runsc (else skipped)
#   scripts/kube-local.sh env     prints `export KUBECONFIG=...` for the suite (tests/conftest.py: AIR_TEST_BACKEND)
#   scripts/kube-local.sh down    stop, then clean: nothing of the cluster keeps running or stays mounted
#   scripts/kube-local.sh STEP... any of: deps src build gvisor pki start images air-setup status smoke stop clean
#   scripts/kube-local.sh --help  this text
# Every step named is checked before the first runs (a typo in the last is said before the first builds).
#
# Everything lives under $KUBE_LOCAL_DIR (default ~/.cache/air-kube-local): the source, the Go build cache and the
# binaries are kept across `clean` (a second `up` starts in seconds); the cluster's state (run/) is not. The folder
# must be new, empty or one this script made (its marker .air-made-by says so): `stop` and `clean` touch nothing in
# another. `stop` ends only the processes it started (each pid file holds the pid, its start time and its program:
# a stale one naming another process is passed over) and the shims of its own containerd's socket.
# Loopback only: etcd, the API server, the kubelet and containerd's stream server listen on 127.0.0.1; the pods sit
# on a bridge of their own (kubelocalbr0, 10.244.77.0/24) with no masquerade. Docker's daemon and its containerd are
# never touched: a containerd of our own (own config, root, state, socket) runs the pods, with runc, and with gVisor
# (RuntimeClass `gvisor`, handler `runsc`) once the `gvisor` step has built gVisor's own containerd shim and runsc
# (KUBE_LOCAL_GVISOR_MIRROR: a git directory of github.com/google/gvisor). Steps' wall times go to
# $KUBE_LOCAL_DIR/timings.txt.
set -euo pipefail

W=${KUBE_LOCAL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/air-kube-local}
SRC=$W/src/kubernetes BIN=$W/bin R=$W/run GV=$W/gvisor
P=$R/pki LOGS=$R/logs
COMMIT=b0969b5cd4          # openshift/microshift, 2026-01-20: deps/github.com/openshift/kubernetes is v1.34.2, go 1.24.0
TREE=deps/github.com/openshift/kubernetes
VERSION=v1.34.2
PAUSE=registry.k8s.io/pause:3.10.1
GVISOR_GO=a2b0498dbe       # google/gvisor's go branch (Go-buildable) at release-20240729.0, Debian trixie's runsc
IMAGES=${KUBE_LOCAL_IMAGES:-air/base:latest air/cpu:latest}
SLOTS=${KUBE_LOCAL_SLOTS:-16}
HERE=$(cd "$(dirname "$0")" && pwd)
export PATH=/usr/lib/go-1.24/bin:$PATH
CTR=(ctr --address "$R/containerd/containerd.sock" --namespace k8s.io)
KC=(kubectl --kubeconfig "$P/admin.kubeconfig")

say() { echo "kube-local: $*" >&2; }
# shellcheck source=owned.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/owned.sh"
ME=kube-local.sh
timed() {  # STEP NAME: run it, append its wall time (in $KUBE_LOCAL_DIR only when the folder is ours)
  local name=$1 t0 t1 line; shift; t0=$(date +%s.%N); "$@"; t1=$(date +%s.%N)
  line=$(printf '%s %-10s %7.1f s' "$(date -u +%FT%TZ)" "$name" "$(echo "$t1 - $t0" | bc)")
  echo "$line" >&2
  if owned "$W" $ME; then echo "$line" >>"$W/timings.txt"; fi
}
until_ok() {  # WHAT SECONDS CMD...: poll once a second; give up at once if the component died
  local what=$1 n=$2; shift 2
  for _ in $(seq "$n"); do
    "$@" >/dev/null 2>&1 && return 0
    [ -f "$R/$what.pid" ] && ! alive "$what" && { say "$what exited: $(tail -1 "$LOGS/$what.log")"; return 1; }
    sleep 1
  done
  say "gave up waiting for $what after ${n} s (logs: $LOGS)"; return 1
}
spawn() {  # NAME CMD...: in the background, its pid, start time and program in $R/NAME.pid (unless it runs
  local name=$1; shift  # already: start again resumes)
  alive "$name" && return
  (cd "$R" && exec "$@") >"$LOGS/$name.log" 2>&1 &
  remember "$R/$name.pid" $! "${1##*/}"
}
alive() {  # NAME: the process spawn recorded for it still runs (the same pid, start time and program)
  recorded "$R/$1.pid" >/dev/null
}
shim() {  # PIDFILE: the pid our containerd recorded there for a shim, when it runs a containerd shim given OUR
  # containerd's socket (a shim of another containerd, or any other process, is not ours to end)
  local pid
  pid=$(cat "$1" 2>/dev/null) && [[ $pid =~ ^[0-9]+$ ]] && case $(program "$pid") in containerd-shim*) ;; *) false;; esac \
    && tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF "$R/containerd/containerd.sock" && echo "$pid"
}
mine() {  # STEP: $KUBE_LOCAL_DIR is ours (or holds no cluster); else one line and exit 2, before anything is touched
  [ -d "$R" ] || return 0
  owned "$W" $ME || { say "$W was not made by $ME (no .air-made-by of its own there): nothing of it is $1's to" \
                          "touch"; exit 2; }
}
need() {  # PROGRAM...: each on PATH, else one line naming it and the step that installs it
  local c
  for c in "$@"; do command -v "$c" >/dev/null || { say "$c is not installed (scripts/kube-local.sh deps installs it)"; exit 2; }; done
}
kube_chains() {  # "TOOL TABLE CHAIN" for every KUBE-* chain there is (the kubelet makes them; so may others)
  local tool t
  for tool in iptables ip6tables; do
    command -v "$tool" >/dev/null || continue
    for t in filter nat mangle; do
      { "$tool" -t "$t" -S 2>/dev/null || true; } | awk -v tool="$tool" -v t="$t" '$1 == "-N" && $2 ~ /^KUBE-/ {print tool, t, $2}'
    done
  done
}
drop_chains() {  # the KUBE-* chains that were not there before start (the kubelet's), and every rule jumping to one
  [ -f "$R/host-chains" ] || return 0
  local new tool t c rule
  new=$(kube_chains | grep -vxF -f "$R/host-chains" || true)
  [ -n "$new" ] || return 0
  while read -r tool t c; do  # the jumps first (from the built-in chains too: INPUT, OUTPUT), then its rules
    { "$tool" -t "$t" -S | grep -E -- "-j $c( |\$)" || true; } | while read -r rule; do
      xargs "$tool" -t "$t" <<<"-D ${rule#-A }" || true; done
    "$tool" -t "$t" -F "$c" || true
  done <<<"$new"
  while read -r tool t c; do "$tool" -t "$t" -X "$c" || true; done <<<"$new"
  say "removed the kubelet's iptables chains: $(awk '{print $3}' <<<"$new" | sort -u | tr '\n' ' ')"
}

deps() {
  # trixie's Go (1.24) and etcd; the CNI plugins, containerd and runc from whichever suite has them; runsc for gVisor
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends golang-1.24-go golang-1.24-src \
    etcd-server/trixie containernetworking-plugins containerd runc runsc/trixie bc openssl gcc libc6-dev >/dev/null
  go version; etcd --version | sed -n 1p; containerd --version; runsc --version | sed -n 1p
}

src() {
  [ -d "$SRC/cmd/kubelet" ] && { say "source already at $SRC"; return; }
  local mirror=${KUBE_LOCAL_MIRROR:?set KUBE_LOCAL_MIRROR to a git directory of github.com/openshift/microshift}
  mkdir -p "$W/src"
  # Through a scratch index rather than `git archive`: the snapshot lacks two test-only swagger.json blobs, which
  # archive cannot leave out; nothing built reads them.
  local index=$W/src/index
  GIT_INDEX_FILE=$index git --git-dir="$mirror" read-tree "$COMMIT:$TREE"
  GIT_INDEX_FILE=$index git --git-dir="$mirror" rm -q --cached --ignore-unmatch \
    staging/src/k8s.io/cli-runtime/artifacts/openapi/swagger.json staging/src/k8s.io/kubectl/testdata/openapi/swagger.json
  GIT_INDEX_FILE=$index git --git-dir="$mirror" checkout-index -a --prefix="$SRC/"
  rm -f "$index"
  du -sh "$SRC"
}

build() {
  mkdir -p "$BIN"
  local want=() c
  for c in kube-apiserver kubelet kube-scheduler kube-controller-manager; do [ -x "$BIN/$c" ] || want+=("./cmd/$c"); done
  if [ ${#want[@]} -gt 0 ]; then
    local ld="-s -w" x
    for x in gitVersion=$VERSION gitMajor=1 gitMinor=34 gitTreeState=clean buildDate=2026-01-20T00:00:00Z; do
      ld="$ld -X k8s.io/component-base/version.$x"; done
    # nice: on a shared machine the build (about 15 CPU-minutes) yields to everyone else's work
    (cd "$SRC" && GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=vendor GOCACHE=$W/gocache GOPATH=$W/gopath \
      CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "$ld" -o "$BIN/" "${want[@]}")
  fi
  if [ ! -f "$W/pause/pause.tar" ]; then  # registry.k8s.io is out of reach: the sandbox image from the tree's pause.c
    mkdir -p "$W/pause"
    gcc -Os -static -DVERSION=3.10.1 -o "$W/pause/pause" "$SRC/build/pause/linux/pause.c"
    strip "$W/pause/pause"
    python3 "$HERE/kube_local_image.py" "$W/pause/pause" "$W/pause/pause.tar" "$PAUSE"
  fi
  ls -l "$BIN"
}

gvisor() {  # gVisor's own containerd shim and a runsc that runs in a pod's network namespace, built offline
  if [ -x "$GV/bin/containerd-shim-runsc-v1" ] && [ -x "$GV/bin/runsc" ]; then say "gVisor already built in $GV/bin"; return; fi
  [ -n "${KUBE_LOCAL_GVISOR_MIRROR:-}" ] || { say "no KUBE_LOCAL_GVISOR_MIRROR: gVisor not built, no runsc handler"; return; }
  # The Go module proxy is out of reach, so GOPATH mode over Debian's Go source packages (as Debian builds runsc):
  # runsc's dependencies from trixie; the shim's containerd v1.6 API (it was written against v1.4; trixie has 1.7,
  # whose shim API moved to other protobuf types) and its dependencies from bookworm. Unpacked, never installed.
  local t b d
  t="golang-gvisor-gvisor-dev golang-github-cenkalti-backoff-dev golang-github-cilium-ebpf-dev golang-dbus-dev
     golang-github-coreos-go-systemd-dev golang-github-gofrs-flock-dev golang-github-google-btree-dev
     golang-github-google-subcommands-dev golang-github-kr-pty-dev golang-github-mohae-deepcopy-dev
     golang-github-opencontainers-specs-dev golang-github-vishvananda-netlink-dev golang-github-vishvananda-netns-dev
     golang-gocapability-dev golang-golang-x-exp-dev golang-golang-x-mod-dev golang-golang-x-sync-dev
     golang-golang-x-sys-dev golang-golang-x-time-dev golang-google-protobuf-dev golang-github-bits-and-blooms-bitset-dev
     golang-github-containerd-console-dev golang-github-containerd-fifo-dev golang-github-gogo-protobuf-dev
     golang-github-burntsushi-toml-dev golang-github-golang-protobuf-1-5-dev"
  b="golang-github-containerd-containerd-dev golang-github-containerd-cgroups-dev golang-github-containerd-typeurl-dev
     golang-github-containerd-ttrpc-dev golang-github-containerd-go-runc-dev golang-github-docker-go-events-dev
     golang-github-docker-go-units-dev golang-github-hashicorp-go-multierror-dev golang-github-hashicorp-errwrap-dev
     golang-github-moby-sys-dev golang-github-opencontainers-go-digest-dev golang-github-opencontainers-image-spec-dev
     golang-github-pkg-errors-dev golang-google-genproto-dev golang-google-grpc-dev golang-github-sirupsen-logrus-dev"
  wipe "$W" $ME "$GV/debs" "$GV/deps" "$GV/gopath"; mkdir -p "$GV/debs" "$GV/bin"
  # shellcheck disable=SC2046,SC2086
  (cd "$GV/debs" && apt-get -o APT::Sandbox::User=root download $(printf '%s/trixie ' $t) $(printf '%s/bookworm ' $b) >/dev/null)
  for d in "$GV"/debs/*.deb; do dpkg -x "$d" "$GV/deps"; done
  local src=$GV/gopath/src/gvisor.dev/gvisor
  mkdir -p "$GV/gopath/src/gvisor.dev"
  mv "$GV/deps/usr/share/gocode/src/gvisor.dev/gvisor" "$src"  # Debian's tree of release 20240729, its patches in
  # Linux >= 6.11 has net.core.rmem_default in every network namespace, so this release's runsc took each pod's for
  # the root one: "cannot run with network enabled in root network namespace". Upstream's fix (19f6b0c07, 2024-07-31)
  sed -i 's#/proc/sys/net/core/rmem_default#/proc/sys/net/core/dev_weight#' "$src/runsc/sandbox/network.go"
  # Debian's Go source package carries placeholders for what its own rules compile from C (the vDSO, systrap's
  # signal-handler stub and its offsets, the XDP programs): a runsc built on them dies at once (no vDSO) or loses
  # its first process ("systrap corrupted memory: subprocess died"). The go branch carries them built.
  local f
  for f in pkg/sentry/loader/vdsodata/vdso_amd64.so pkg/sentry/platform/systrap/sysmsg/sighandler.built-in.amd64.bin \
           pkg/sentry/platform/systrap/sysmsg/sighandler_amd64.go runsc/sandbox/bpf/af_xdp_ebpf.o \
           runsc/sandbox/bpf/tunnel_veth_ebpf.o; do
    git --git-dir="$KUBE_LOCAL_GVISOR_MIRROR" show "$GVISOR_GO:$f" >"$src/$f"; done
  # The shim, which Debian leaves out
  git --git-dir="$KUBE_LOCAL_GVISOR_MIRROR" archive "$GVISOR_GO" shim pkg/shim | tar -x -C "$src"
  # containerd v1.6's shim API, against the v1.4 one the shim was written for: a console's copy names its process,
  # StartShim takes one options struct, and SetScore is AdjustOOMScore
  sed -i 's/Platform\.CopyConsole(ctx, console, e\.stdio/Platform.CopyConsole(ctx, console, e.id, e.stdio/' "$src/pkg/shim/proc/exec.go"
  sed -i 's/Platform\.CopyConsole(ctx, console, r\.Stdin/Platform.CopyConsole(ctx, console, p.id, r.Stdin/' "$src/pkg/shim/proc/init.go"
  sed -i 's/CopyConsole(ctx context.Context, console console.Console, stdin,/CopyConsole(ctx context.Context, console console.Console, id, stdin,/' \
    "$src/pkg/shim/runsc/service_linux.go"
  sed -i -e 's/StartShim(ctx context.Context, id, containerdBinary, containerdAddress, containerdTTRPCAddress string) (string, error) {/StartShim(ctx context.Context, opts shim.StartOpts) (string, error) {\n\tid, containerdBinary, containerdAddress := opts.ID, opts.ContainerdBinary, opts.Address/' \
    -e 's/shim\.SetScore(/shim.AdjustOOMScore(/' "$src/pkg/shim/service.go"
  (cd "$src" && GO111MODULE=off GOPATH="$GV/gopath:$GV/deps/usr/share/gocode" GOCACHE=$W/gocache GOTOOLCHAIN=local \
    GOFLAGS='' CGO_ENABLED=0 nice -n 19 go build -trimpath \
      -ldflags "-X gvisor.dev/gvisor/runsc/version.version=release-20240729.0+debian+dev_weight" -o "$GV/bin/runsc" ./runsc &&
   GO111MODULE=off GOPATH="$GV/gopath:$GV/deps/usr/share/gocode" GOCACHE=$W/gocache GOTOOLCHAIN=local \
    GOFLAGS='' CGO_ENABLED=0 nice -n 19 go build -trimpath -o "$GV/bin/containerd-shim-runsc-v1" ./shim)
  "$GV/bin/runsc" --version | sed -n 1p; ls -l "$GV/bin"
}

pki() {  # a CA of its own, valid 30 days, and a client or serving certificate per component
  [ -f "$P/ca.crt" ] && return
  need openssl
  mkdir -p "$P"; cd "$P"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 -subj "/CN=air-kube-local-ca" 2>/dev/null
  issue() {  # NAME SUBJECT USAGE [SANS]
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n%s' \
      "$3" "${4:+subjectAltName=$4}" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -extfile "$1.ext" \
      -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
  }
  issue apiserver /CN=kube-apiserver serverAuth \
    "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  issue admin "/CN=admin/O=system:masters" clientAuth
  issue apiserver-kubelet "/CN=kube-apiserver-kubelet-client/O=system:masters" clientAuth
  issue kubelet "/CN=system:node:vm/O=system:nodes" clientAuth
  issue kubelet-serving /CN=vm serverAuth "IP:127.0.0.1,DNS:vm,DNS:localhost"
  issue controller-manager /CN=system:kube-controller-manager clientAuth
  issue scheduler /CN=system:kube-scheduler clientAuth
  openssl genrsa -out sa.key 2048 2>/dev/null; openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  local who
  for who in admin kubelet controller-manager scheduler; do
    cat >"$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: kube-local, cluster: {server: "https://127.0.0.1:6443", certificate-authority: $P/ca.crt}}]
users: [{name: $who, user: {client-certificate: $P/$who.crt, client-key: $P/$who.key}}]
contexts: [{name: kube-local, context: {cluster: kube-local, user: $who, namespace: air}}]
current-context: kube-local
EOF
  done
}

configs() {
  mkdir -p "$R"/{containerd/root,containerd/state,cni/net.d,kubelet/root,kubelet/podlogs,etcd,runc,runsc} "$LOGS"
  local runsc=""
  if [ -x "$GV/bin/containerd-shim-runsc-v1" ]; then
    # gVisor through its own shim (the `gvisor` step): one sandbox per pod, its containers inside it. Through
    # containerd's runc shim with runsc as its binary the pod sandbox started only with --network=host, and its
    # containers never did. KUBE_LOCAL_RUNSC_FLAGS: more of runsc's flags, "name = value" lines (e.g. platform = "ptrace")
    runsc="
      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc]
        runtime_type = \"io.containerd.runsc.v1\"
        runtime_path = \"$GV/bin/containerd-shim-runsc-v1\"
        [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runsc.options]
          TypeUrl = \"io.containerd.runsc.v1.options\"
          ConfigPath = \"$R/runsc/runsc.toml\""
    printf 'binary_name = "%s"\nroot = "%s"\nlog_path = "%s/runsc/"\n[runsc_config]\n%s\n' \
      "$GV/bin/runsc" "$R/runsc/root" "$LOGS" "${KUBE_LOCAL_RUNSC_FLAGS:-}" >"$R/runsc/runsc.toml"
    mkdir -p "$LOGS/runsc" "$R/runsc/root"
  fi
  cat >"$R/containerd/config.toml" <<EOF
version = 2
root = "$R/containerd/root"
state = "$R/containerd/state"
[grpc]
  address = "$R/containerd/containerd.sock"
[ttrpc]
  address = "$R/containerd/containerd.sock.ttrpc"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$R/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    # Root on this machine lacks CAP_SYS_RESOURCE: runc cannot lower the pause container's oom_score_adj below its
    # own, and every pod sandbox failed ("can't get final child's PID from pipe: EOF") until this
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$R/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          Root = "$R/runc"
          SystemdCgroup = false$runsc
EOF
  cat >"$R/cni/net.d/10-kube-local.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "kube-local", "plugins": [
  {"type": "bridge", "bridge": "kubelocalbr0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.77.0/24", "gateway": "10.244.77.1"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$R/cni/ipam"}},
  {"type": "loopback"}]}
EOF
  cat >"$R/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $P/ca.crt}}
authorization: {mode: Webhook}
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
containerRuntimeEndpoint: unix://$R/containerd/containerd.sock
# no systemd here, and cgroup v1: the kubelet's pods go under /kubelocal of each hierarchy (made by start)
cgroupDriver: cgroupfs
cgroupRoot: /kubelocal
failCgroupV1: false
failSwapOn: false
podPidsLimit: 4096
maxPods: 60
podCIDR: 10.244.77.0/24
podLogsDirectory: $R/kubelet/podlogs
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
# the images are imported, never pulled: no garbage collection of them, and disk eviction only when nearly full
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "200Mi", nodefs.available: "2%", imagefs.available: "2%"}
serializeImagePulls: false
EOF
}

cgroups() {  # cgroup v1 without systemd: the kubelet's cgroupRoot must exist in every hierarchy
  local h
  for h in /sys/fs/cgroup/*/; do
    case $h in */unified/) continue;; esac  # the kubelet checks the named systemd hierarchy too
    mkdir -p "$h/kubelocal"
    if [ -f "$h/cpuset.cpus" ]; then cat "$h/cpuset.cpus" >"$h/kubelocal/cpuset.cpus"
                                     cat "$h/cpuset.mems" >"$h/kubelocal/cpuset.mems"; fi
  done
}

containerd_() {  # our containerd alone (images can be imported while the binaries still build)
  alive containerd && return
  # The sandbox image comes from build: without it containerd would start and be left running for nothing
  [ -f "$W/pause/pause.tar" ] || { say "not built yet: run scripts/kube-local.sh build first (or up)"; exit 2; }
  need containerd ctr
  configs
  spawn containerd containerd --config "$R/containerd/config.toml"
  until_ok containerd 30 "${CTR[@]}" version
  "${CTR[@]}" images import "$W/pause/pause.tar" >/dev/null
}

start() {
  local c
  for c in kube-apiserver kubelet kube-scheduler kube-controller-manager; do
    [ -x "$BIN/$c" ] || { say "not built yet: no $BIN/$c (run scripts/kube-local.sh build first, or up)"; exit 2; }; done
  [ -f "$P/ca.crt" ] || { say "no certificates yet: run scripts/kube-local.sh pki first (or up)"; exit 2; }
  need etcd curl
  containerd_; cgroups
  # the KUBE-* chains already there (another cluster's): clean removes only the ones the kubelet adds
  [ -f "$R/host-chains" ] || kube_chains >"$R/host-chains"
  local d  # what the kubelet makes on the host whatever its --root-dir: clean removes only what was not there
  [ -f "$R/host-paths" ] || for d in /var/lib/kubelet /var/log/pods /var/log/containers; do [ -e $d ] || echo $d; done >"$R/host-paths"
  spawn etcd etcd --name kube-local --data-dir "$R/etcd/data" \
    --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
    --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
    --initial-cluster kube-local=http://127.0.0.1:23800 --listen-metrics-urls http://127.0.0.1:23810
  until_ok etcd 30 curl -sf http://127.0.0.1:23790/health
  spawn kube-apiserver "$BIN/kube-apiserver" --etcd-servers=http://127.0.0.1:23790 --bind-address=127.0.0.1 \
    --secure-port=6443 --endpoint-reconciler-type=none --service-cluster-ip-range=10.96.0.0/24 --allow-privileged=true \
    --client-ca-file="$P/ca.crt" --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" \
    --kubelet-client-certificate="$P/apiserver-kubelet.crt" --kubelet-client-key="$P/apiserver-kubelet.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=Hostname \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --profiling=false
  until_ok kube-apiserver 300 "${KC[@]}" get --raw /readyz
  spawn kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig="$P/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$P/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$P/controller-manager.kubeconfig" --bind-address=127.0.0.1 --leader-elect=false \
    --use-service-account-credentials=true --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" --allocate-node-cidrs=false
  spawn kube-scheduler "$BIN/kube-scheduler" --kubeconfig="$P/scheduler.kubeconfig" \
    --authentication-kubeconfig="$P/scheduler.kubeconfig" --authorization-kubeconfig="$P/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --leader-elect=false
  # /etc/hosts may not name this machine "vm": the API server reaches the kubelet (exec, logs) by that name
  spawn kubelet "$BIN/kubelet" --config="$R/kubelet/config.yaml" --kubeconfig="$P/kubelet.kubeconfig" \
    --root-dir="$R/kubelet/root" --cert-dir="$R/kubelet/pki" --hostname-override=vm --v=1
  until_ok kubelet 300 sh -c "${KC[*]} get node vm -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  "${KC[@]}" get nodes -o wide
}

images() {  # from Docker's image store into our containerd (docker save only reads), under every tag it has there
  containerd_; local i  # (air names task images by content tags too)
  for i in $IMAGES; do
    # shellcheck disable=SC2046
    docker save $(docker image inspect --format '{{join .RepoTags " "}}' "$i") | "${CTR[@]}" images import - | tail -1
  done
}

air_setup() {  # what an administrator applies (`air kubernetes setup`), and the classes the cluster tests name
  local py=${AIR_PYTHON:-python3}
  KUBECONFIG=$P/admin.kubeconfig AIR_BACKEND=kubernetes $py -m air.cli.main kubernetes setup --slots "$SLOTS" \
    | "${KC[@]}" apply -f -
  "${KC[@]}" apply -f - <<EOF
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: rollouts}
value: 1000
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gvisor}
handler: runsc
EOF
  KUBECONFIG=$P/admin.kubeconfig AIR_BACKEND=kubernetes $py -m air.cli.main doctor || true
}

status() {
  local n pid; for n in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    if pid=$(recorded "$R/$n.pid"); then echo "$n: running (pid $pid)"; else echo "$n: not running"; fi; done
  if alive kube-apiserver; then "${KC[@]}" get nodes,pods -A -o wide || true; fi
}

smoke() {  # one pod of air's base image, an exec into it, deleted
  "${KC[@]}" -n default run kube-local-smoke --image=air/base:latest --image-pull-policy=Never --restart=Never \
    --command -- sleep 600
  "${KC[@]}" -n default wait --for=condition=Ready pod/kube-local-smoke --timeout=120s
  "${KC[@]}" -n default exec kube-local-smoke -- sh -c 'id; cat /proc/net/dev | tail -n +3 | cut -d: -f1'
  "${KC[@]}" -n default delete pod kube-local-smoke --now
}

env_() {  # quoted: a path with a space stays one word
  [ -f "$P/admin.kubeconfig" ] || { say "no cluster set up in $W (no $P/admin.kubeconfig): scripts/kube-local.sh up"
                                    exit 1; }
  printf 'export KUBECONFIG=%q\n' "$P/admin.kubeconfig"
}

stop() {  # by pid only; the pods first, so that the kubelet takes their sandboxes down
  [ -d "$R" ] || { say "no cluster in $R: nothing to stop"; return 0; }
  mine stop
  if alive kube-apiserver && alive kubelet; then
    "${KC[@]}" delete pods --all -A --now --wait=false >/dev/null 2>&1 || true
    for _ in $(seq 30); do [ -z "$("${CTR[@]}" tasks ls -q 2>/dev/null)" ] && break; sleep 1; done
  fi
  local n pid
  for n in kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do
    if pid=$(recorded "$R/$n.pid"); then kill "$pid" || true; fi; rm -f "$R/$n.pid"; done
  if alive containerd; then  # whatever the kubelet left, through OUR containerd's socket
    local t c
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks kill -s KILL "$t" 2>/dev/null || true; done
    sleep 2
    for t in $("${CTR[@]}" tasks ls -q 2>/dev/null); do "${CTR[@]}" tasks delete -f "$t" >/dev/null 2>&1 || true; done
    for c in $("${CTR[@]}" containers ls -q 2>/dev/null); do "${CTR[@]}" containers delete "$c" >/dev/null 2>&1 || true; done
    if pid=$(recorded "$R/containerd.pid"); then kill "$pid" || true; fi
    for _ in $(seq 20); do alive containerd || break; sleep 0.5; done
  fi
  rm -f "$R/containerd.pid"
  # shims whose containerd is gone: only those whose pid our containerd recorded (shim.pid in its state), never a
  # process found by its command line (a `tail -f` of our logs is not ours to end)
  local f
  for f in "$R"/containerd/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
    [ -f "$f" ] || continue
    pid=$(shim "$f") && { kill -9 "$pid" 2>/dev/null || true; }
  done
  say "stopped"
}

clean() {  # after stop: this cluster's mounts, network namespaces, bridge, cgroups and state; the build stays
  [ -d "$R" ] || { say "no cluster in $R: nothing to clean"; return 0; }
  mine clean
  alive kube-apiserver && { say "running: stop first"; return 1; }
  { grep -o " $R/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  local ns
  for ns in /var/run/netns/cni-*; do
    [ -e "$ns" ] || continue
    ns=${ns##*/}
    if ip netns exec "$ns" ip -4 addr 2>/dev/null | grep -q ' 10\.244\.77\.'; then ip netns delete "$ns" || true; fi; done
  if ip link show kubelocalbr0 >/dev/null 2>&1; then ip link delete kubelocalbr0 || true; fi
  drop_chains
  local h
  for h in /sys/fs/cgroup/*/kubelocal; do [ -d "$h" ] && find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null; done || true
  for h in /var/log/containers/*; do [ -L "$h" ] && readlink "$h" | grep -q "^$R/" && rm -f "$h"; done 2>/dev/null || true
  if [ -f "$R/host-paths" ]; then  # only the kubelet's own folders, and only those that were not there before start
    while read -r h; do case $h in /var/lib/kubelet|/var/log/pods|/var/log/containers) rm -rf "$h";; esac
    done <"$R/host-paths"
  fi
  wipe "$W" $ME "$R"
  say "cleaned"
}

fn() { case $1 in containerd) echo containerd_;; *) echo "${1//-/_}";; esac; }
STEPS="deps src build gvisor pki containerd start images air-setup status smoke env stop clean up down"

main() {
  local s t
  for s in "$@"; do  # every step checked before the first runs
    case $s in
      -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0;;
      up|down|env|status|deps|src|build|gvisor|pki|containerd|start|images|air-setup|smoke|stop|clean) ;;
      *) say "unknown step: $s (one of: $STEPS; --help says what each does)"; exit 2;;
    esac
  done
  [ $# -gt 0 ] || set -- status
  for s in "$@"; do  # a step that writes there takes the folder first (new, empty or ours); the others write nothing
    case $s in env|status|stop|clean|down) ;; *) claim "$W" $ME;; esac
  done
  for s in "$@"; do
    case $s in
      up) for t in deps src build gvisor pki start images air-setup; do timed "$t" "$(fn "$t")"; done;;
      down) timed stop stop; timed clean clean;;
      env) env_;;
      status) status;;
      *) timed "$s" "$(fn "$s")";;
    esac
  done
}

# Sourced (the tests call its functions), it runs nothing
if [ "${BASH_SOURCE[0]}" = "$0" ]; then main "$@"; fi
