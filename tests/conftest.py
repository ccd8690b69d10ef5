"""Shared fixtures. Real-Docker tests carry `@pytest.mark.docker`: they skip without a daemon on a laptop,
and fail under CI (CI=true), where a missing daemon is a broken set-up, not a reason to pass."""

from __future__ import annotations

import os
import time
import signal
import uuid

import pytest

from air.errors import DockerUnavailable

collect_ignore_glob = ["fixtures/*"]
"""Task folders (a Harbor task's own tests/test_*.py among them) are data that tests score, never tests to collect."""

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Bundled tasks score against the record's draw of their hidden data in tests (and in every air process a test
# starts): the scripted stories' expected scores are the record's. The per-host draw, the default everywhere else,
# is tested where a test asks for it (draw="host"; tests/test_honest_tasks.py).
os.environ.setdefault("AIR_HIDDEN_DRAW", "reference")
# Results of evaluations on hidden data come at once, not on the coarse clock's ticks (air/tasks/scoring.py): no policy
# learns from the suite's timings, and the ticks would add about half of every such evaluation's time to the suite.
# tests/test_evaluation_clock.py turns the clock back on.
os.environ.setdefault("AIR_RESULT_CLOCK", "1")
# A SIGHUP ignored here (the suite run under `nohup`) would be ignored by every air process a test starts, and the
# tests that end one with SIGHUP would wait for nothing: the processes the tests start get the default, as from a
# terminal.
signal.signal(signal.SIGHUP, signal.SIG_DFL)
# The tests stand for a terminal: an `air` they start and Ctrl-C must get SIGINT as a terminal's foreground job
# does. A launcher that runs the suite as a background job of a non-interactive shell (`.ci/run &`) passes SIGINT
# down ignored, and an ignored signal survives exec: every child would shrug Ctrl-C off.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
ENROOT = os.environ.get("AIR_TEST_BACKEND") == "enroot"
"""`AIR_TEST_BACKEND=enroot pytest tests/test_hardening.py ...`, run as a user who is not root, with subordinate uids,
enroot on PATH and the images' squashfs files (docs/hpc.md): every pool the tests make (and every air process they
start) runs on the enroot backend, with Docker unreachable. A test that speaks to Docker's daemon itself (the
`docker_client` fixture) skips and says so; a difference from Docker is skipped or pinned where the test stands."""
if ENROOT:
    os.environ["AIR_BACKEND"] = "enroot"
    os.environ["DOCKER_HOST"] = "unix:///nonexistent"  # nothing reaches a daemon by accident
NOT_ON_ENROOT = "AIR_TEST_BACKEND=enroot: "
"""How every skip of the enroot lane starts: the reason follows."""
BASE_IMAGE = "air/base:latest"
CPU_IMAGE = "air/cpu:latest"


def _no_docker(reason: str):
    if IN_CI:
        pytest.fail(f"Docker is required under CI: {reason}", pytrace=False)
    pytest.skip(f"no Docker daemon: {reason}")


@pytest.fixture(scope="session")
def docker_client():
    if ENROOT:
        pytest.skip(NOT_ON_ENROOT + "the test speaks to Docker's daemon itself (its containers, its API); enroot has "
                    "no daemon")
    from air.sandbox import connect

    try:
        client = connect(timeout=30)
    except DockerUnavailable as exc:
        _no_docker(str(exc))
    yield client
    client.close()


@pytest.fixture(scope="session")
def images(request):
    """The CPU recipes built (or reused: a no-op when the README's set-up already built them); on enroot, their
    squashfs files present and the node able to run the backend."""
    if ENROOT:
        return enroot_ready()
    docker_client = request.getfixturevalue("docker_client")
    from air.images import ImageBuilder

    built = {b.recipe: b for b in ImageBuilder(docker_client).ensure(["base", "cpu"])}
    _hold_the_cpu_images_pin(docker_client)
    return built


def _hold_the_cpu_images_pin(client) -> None:
    """This worker holds the host's page-cache pin of air/cpu (its tmpfs copy, for sandboxes with cells) for the
    whole session, as a long training run would. Without a holder it ends 120 s after the last test of the image
    and the next one copies the 1.7 GB again: six copies a lane, 3-6 s of CPU each (experiments.md, session 60)."""
    import asyncio
    import atexit

    from air.sandbox.docker.docker_api import Docker
    from air.sandbox.docker.pagecache import PageCachePins
    from air.sandbox.spec import SandboxSpec

    pins = PageCachePins(Docker(client), run="test-session")
    asyncio.run(pins.ensure(SandboxSpec(image="air/cpu:latest"), copy=True))
    atexit.register(lambda: asyncio.run(pins.close()))  # its lock goes with this process anyway


@pytest.fixture(scope="session")
def toolchain_built(docker_client) -> dict:
    """The toolchain image and its parents, built offline (or reused: a no-op when `scripts/setup.sh --test` built
    them), by recipe. Used by their content tags: on a shared daemon another checkout may point `:latest`
    elsewhere."""
    from air.images import ImageBuilder

    return {image.recipe: image for image in ImageBuilder(docker_client).ensure(["toolchain"])}


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=ENROOT)
def _enroot_has_cells_only(request):
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("isolation") == "containers":
        pytest.skip(NOT_ON_ENROOT + 'isolation="containers" (a Docker host that forbids cells): every enroot sandbox '
                    "has cells, and the backend refuses it (tests/test_enroot.py)")


def enroot_ready() -> dict:
    """The enroot lane's set-up, checked once: not root, the backend's own check of the node, air/base's squashfs
    file (a test of air/cpu without its file fails in one line naming the export). A missing part fails the lane in
    one line: it was asked for by name."""
    from air import squashfs
    from air.errors import ImageError
    from air.sandbox.enroot.launcher import Enroot, Userns

    why = None
    if os.geteuid() == 0:
        why = "run the suite as a user who is not root (the backend's user; docs/hpc.md)"
    elif Enroot(root=None).version() is None:
        why = "enroot is not on PATH (scripts/enroot-build.sh)"
    else:
        why = Userns.probe().check()
    try:
        squashfs.resolve(BASE_IMAGE)
    except ImageError as exc:
        why = why or str(exc)
    if why:
        pytest.fail(f"AIR_TEST_BACKEND=enroot cannot run here: {why}", pytrace=False)
    return {}


def task_images(specs) -> None:
    """Tasks' own images (Harbor tasks' Dockerfiles) built; on enroot, their squashfs files present (no Docker to
    build with: exported where Docker built them), else the test skips naming the export."""
    from air.tasks.task_images import build_task_image

    for spec in specs:
        if not ENROOT:
            build_task_image(spec)
            continue
        from air import squashfs
        from air.errors import ImageError

        try:
            for ref in filter(None, (spec.image, spec.verifier_image)):  # the scoring image, where it has its own
                squashfs.resolve(ref)
        except ImageError as exc:
            pytest.skip(NOT_ON_ENROOT + str(exc))


def enroot_sandboxes() -> set[str]:
    """This user's enroot container roots of sandboxes (an image's unpacked root is a cache, not a sandbox)."""
    from air.sandbox.enroot.launcher import Enroot
    from air.sandbox.enroot.pool import enroot_root

    return {n for n in Enroot(enroot_root()).names() if not n.startswith("air-image-")}


def enroot_leaks(run: str, before: set[str]) -> list[str]:
    """The enroot container roots of run `run` (the run id its pool wrote beside each), and any new since `before`
    that names no run: never another run's of the same user (issue 85: a second run of the user's, a suite or an
    `air eval` beside the test, counted as the test's leak)."""
    from air.sandbox.enroot.leftovers import run_of

    return sorted(n for n in enroot_sandboxes() if run_of(n) == run or (run_of(n) is None and n not in before))


async def closed_leaving_nothing(p, client, before: set[str] | None = None) -> None:
    """Close a pool; afterwards not one container of its run may remain (on enroot, where `client` is None: no
    container root of the pool's run, nor a new one of no run)."""
    await p.close()
    if ENROOT:
        left = enroot_leaks(p.run_id, before or set())
        assert not left and not p.left_behind, f"enroot containers leaked by the test: {left}"
        return
    from air.sandbox import list_air_containers

    left = list_air_containers(client, run=p.run_id)
    for _ in range(20):  # an ended sandbox the daemon is still removing (auto_remove) goes within moments
        if not left or any(c.status not in ("removing", "exited", "dead") for c in left):
            break
        time.sleep(0.5)
        left = list_air_containers(client, run=p.run_id)
    assert not left, f"containers leaked by the test: {[(c.name, c.status) for c in left]}"


@pytest.fixture
def leftovers(request, run_id):
    """What the test's run left behind, when called: Docker's containers of run_id, or on enroot run_id's container
    roots (and new ones that name no run)."""
    if ENROOT:
        before = enroot_sandboxes()
        return lambda: enroot_leaks(run_id, before)
    from air.sandbox import list_air_containers

    client = request.getfixturevalue("docker_client")
    return lambda: list_air_containers(client, run=run_id)


@pytest.fixture
async def pool(request, images, run_id):
    """A pool for one test; afterwards not one container of its run may remain."""
    from air.sandbox import PoolConfig, SandboxPool

    client = None if ENROOT else request.getfixturevalue("docker_client")
    before = enroot_sandboxes() if ENROOT else None
    p = SandboxPool(PoolConfig(run_id=run_id, max_sandboxes=24, gpu_ids=[], lease_timeout=120))
    await p.start()
    yield p
    await closed_leaving_nothing(p, client, before)


@pytest.fixture
def base_spec():
    from air.sandbox import Resources, SandboxSpec

    return SandboxSpec(image=BASE_IMAGE, task="conformance", resources=Resources(cpus=1, memory_mb=512, pids=256))


KUBERNETES_FAKE = os.environ.get("AIR_TEST_BACKEND") == "kubernetes-fake"
"""`AIR_TEST_BACKEND=kubernetes-fake pytest tests/test_hardening.py ...`: every pool the tests make (and every air
process they start) runs on the kubernetes backend, through the fake API server below, its pods local containers."""
KUBERNETES_REAL = os.environ.get("AIR_TEST_BACKEND") == "kubernetes"
"""`AIR_TEST_BACKEND=kubernetes KUBECONFIG=... pytest ...`: the same on the real cluster KUBECONFIG names (its
namespace set up, the task images on its nodes; scripts/kube-local.sh makes one here): every use of `kube_fake`
gets it instead (tests/kube_real.py), and the fake's fault injection is skipped."""


@pytest.fixture(scope="session", autouse=KUBERNETES_FAKE or KUBERNETES_REAL)
def kubernetes_everywhere(request):
    if not (KUBERNETES_FAKE or KUBERNETES_REAL):
        yield None
        return
    fake = request.getfixturevalue("kube_fake")
    saved = {k: os.environ.get(k) for k in ("AIR_BACKEND", "KUBECONFIG")}
    os.environ.update(AIR_BACKEND="kubernetes", KUBECONFIG=fake.kubeconfig)
    yield fake
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def kube_fake(images):
    """A FAKE Kubernetes API server (tests/kube_fake.py) whose kubelet runs each pod as a container of this machine's
    Docker daemon, with the real warden in it: the kubernetes backend's lifecycle end to end, without a cluster.
    With AIR_TEST_BACKEND=kubernetes, the real cluster instead."""
    if ENROOT:
        pytest.skip(NOT_ON_ENROOT + "the kubernetes backend's pods run on Docker here")
    if KUBERNETES_REAL:
        from kube_real import RealCluster

        if not os.environ.get("KUBECONFIG"):
            pytest.fail("AIR_TEST_BACKEND=kubernetes needs KUBECONFIG (scripts/kube-local.sh env)", pytrace=False)
        yield RealCluster(os.environ["KUBECONFIG"])
        return
    from kube_fake import FakeCluster

    with FakeCluster(kubelet="docker") as fake:
        yield fake


def kubernetes_config(kubeconfig: str, **pool: object):
    """A PoolConfig for the kubernetes backend on a fake (or real) cluster."""
    from air.sandbox import PoolConfig
    from air.sandbox.kubernetes.config import KubernetesConfig

    return PoolConfig(backend="kubernetes", kubernetes=KubernetesConfig(kubeconfig=kubeconfig), gpu_ids=[], **pool)


# ----- the order test files start in ------------------------------------------------------------------------------
MEASURED_SECONDS = {
    # A file's time in the Docker lane of `.ci/run` (its junit report: two workers on the 2-core machine,
    # 2026-11-24; experiments.md). pytest-xdist hands whole files to the workers (three since session 74) as they
    # free up, by default the files with the most tests first, which put the few-test, minutes-long files last: one
    # worker then ran them alone while the others idled. Longest first instead (`--no-loadscope-reorder` keeps this
    # order), so the run ends on short files. Files not listed follow, most tests first, as before.
    "test_vf_eval.py": 219, "test_sandbox.py": 209, "test_env_server.py": 203, "test_cli_failures.py": 167,
    "test_soak_host.py": 140, "test_trl_grpo.py": 95, "test_sandbox_fusion_languages.py": 90, "test_agentgym.py": 90,
    "test_honest_tasks.py": 89, "test_fresh_cells.py": 80, "test_adversarial.py": 71, "test_openenv.py": 70,
    "test_agentgym_trainers.py": 66, "test_integrity.py": 63, "test_serve_exits.py": 60, "test_tools_format.py": 58,
    "test_run_endings.py": 49, "test_cli_research.py": 48, "test_harbor_runs.py": 45, "test_mlgym.py": 40,
    "test_harbor_sandbox.py": 38, "test_sandbox_fusion_jupyter.py": 34, "test_replay.py": 32,
    "test_mlgym_bench.py": 28, "test_host_budget.py": 26, "test_images_cli.py": 25,
    # With harbor-cookbook's recipes (HARBOR_COOKBOOK: CI's node lanes unpack them; issue 85), one worker, a busy
    # machine, session 70: their recipe tests were skips before.
    "test_harbor_environment.py": 318, "test_harbor_cookbook.py": 221,
    # A real model on the CPU (issue 82; one worker, load 9-12, session 70): its training smoke and its endpoint.
    "test_real_model_training.py": 154, "test_model_server.py": 44,
    # The Docker lane as CI runs it, the Docker-free lane beside, 2026-11-28 (session 73; junit): files that had no
    # entry. prime-rl's orchestrator runs where ~/.cache/air/prime-rl holds its sources, as CI's machine did for
    # stop 90; unlisted, its eight tests started among the last files, a tail of minutes on one worker.
    "test_docs.py": 530, "test_prime_rl_orchestrator.py": 380, "test_fork.py": 224, "test_audit.py": 210,
    "test_audit_watch.py": 173,
}


def pytest_collection_modifyitems(config, items):
    counts: dict[str, int] = {}
    for item in items:
        counts[item.path.name] = counts.get(item.path.name, 0) + 1
    # stable: each file's own tests keep their order
    items.sort(key=lambda item: (-MEASURED_SECONDS.get(item.path.name, 0), -counts[item.path.name], item.path.name))


@pytest.fixture
def daemon_proxy(docker_client):
    """A TCP front for the local daemon (tests/docker_proxy.py) that can cut itself off or answer chosen requests
    late: a daemon elsewhere, stalled or wedged, as far as its clients can tell."""
    from docker_proxy import CuttableProxy

    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        pytest.skip("the proxy fronts a local daemon's unix socket")
    proxy = CuttableProxy(host.removeprefix("unix://"))
    yield proxy
    proxy.close()
