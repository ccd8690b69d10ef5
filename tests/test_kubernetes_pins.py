"""The kubernetes pool's page-cache pins against the FAKE API server (tests/kube_fake.py, stub kubelet: its pin pods
say `air-pinned` as air's pin program does): a pin pod per image and node, made before a sandbox's first cell and
waited for on its log; outside a quota scoped NotBestEffort; a pin the cluster takes away no longer claimed and
replaced; every pin removed at close, and by a sweep after a SIGKILL. The real pin program on the real one-node
cluster: tests/test_fresh_cells.py in the cluster lane (experiments.md, session 65)."""

from __future__ import annotations

import asyncio
import time

import pytest

from air.errors import InfraError
from air.sandbox import SandboxPool, SandboxSpec
from air.sandbox.kubernetes import manifests as m
from air.sandbox.kubernetes.api import KubeApi
from air.sandbox.kubernetes.config import KubernetesConfig
from air.sandbox.kubernetes.sweep import sweep
from conftest import kubernetes_config
from kube_fake import FakeCluster

SPEC = SandboxSpec(image="air/base:latest", task="pins")
OTHER = SandboxSpec(image="air/cpu:latest", task="pins")


@pytest.fixture
def fake():
    with FakeCluster(kubelet="stub") as cluster:
        yield cluster


def pool_of(fake, *, kube: dict | None = None, **options) -> SandboxPool:
    config = kubernetes_config(fake.kubeconfig, max_sandboxes=8, **options)
    config.kubernetes = config.kubernetes.model_copy(update=kube or {})
    return SandboxPool(config)


async def api_of(fake) -> KubeApi:
    api = KubeApi(KubernetesConfig(kubeconfig=fake.kubeconfig))
    await api.open()
    return api


async def pods(api: KubeApi, role: str) -> list[dict]:
    return (await api.list("pods", f"{m.ROLE}={role}")).get("items", [])


async def eventually(check, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def test_a_pin_per_image_and_node_holds_before_the_first_cell_and_goes_at_close(fake):
    api = await api_of(fake)
    try:
        async with pool_of(fake) as pool:
            async with pool.lease(SPEC) as sb, pool.lease(SPEC), pool.lease(OTHER):
                pins = await pods(api, "pin")
                assert sorted(p["spec"]["containers"][0]["image"] for p in pins) == ["air/base:latest",
                                                                                    "air/cpu:latest"]
                for pin in pins:
                    assert pin["spec"]["nodeName"] == sb.node == "fake-node-1"
                    assert "resources" not in pin["spec"]["containers"][0], "BestEffort: outside the slots"
                    assert pin["metadata"]["ownerReferences"][0]["kind"] == "Lease"
                held = await pool.page_cache_pins()
                assert sorted(h["name"] for h in held) == sorted(p["metadata"]["name"] for p in pins)
                assert all(h["files"] == 3 and h["node"] == "fake-node-1" for h in held)
            # the pin was made, and read ready, before the sandbox's first reset (its first cell)
            assert pool.api.calls["GET pods/log"] >= 2
        assert await pods(api, "pin") == [] and await pods(api, "agent") == []
    finally:
        await api.close()


async def test_a_sandbox_waits_for_its_pin_to_say_it_holds_the_pages(fake, monkeypatch):
    """A pin that has not said `air-pinned` holds nothing yet: no sandbox gets its first cell; one that never says it,
    or says it failed, fails the lease as infrastructure, naming the fix, and leaves no pod."""
    monkeypatch.setattr("air.sandbox.kubernetes.pool.PIN_TIMEOUT", 1.0)
    api = await api_of(fake)
    try:
        async with pool_of(fake, kube={"pod_attempts": 1}) as pool:
            fake.control("pin-words", words="")
            with pytest.raises(InfraError, match="did not hold the image's pages within 1s.*page_cache"):
                async with pool.lease(SPEC):
                    pass
            fake.control("pin-words", words="air-pin-error mlock: Operation not permitted\n")
            with pytest.raises(InfraError, match="failed: mlock: Operation not permitted.*CAP_IPC_LOCK"):
                async with pool.lease(SPEC):
                    pass
            assert await eventually(lambda: _none(api)), "the failed pins and their sandboxes are deleted"
            assert await pool.page_cache_pins() == []
    finally:
        await api.close()


async def _none(api: KubeApi) -> bool:
    return not (await api.list("pods", m.RUN)).get("items")


async def test_a_pin_the_cluster_takes_away_is_no_longer_claimed_and_is_replaced(fake, monkeypatch):
    monkeypatch.setattr("air.sandbox.kubernetes.pool.PIN_TIMEOUT", 1.0)
    api = await api_of(fake)
    try:
        async with pool_of(fake) as pool:
            async with pool.lease(SPEC):
                first = (await pool.page_cache_pins())[0]["name"]
                fake.control("evict", name=first, message="The node was low on resource: memory.")

                async def replaced() -> bool:
                    held = await pool.page_cache_pins()
                    return bool(held) and held[0]["name"] != first
                assert await eventually(replaced), "a new pin holds the pages"
                assert pool.pins_lost == 1
                assert [p["metadata"]["name"] for p in await pods(api, "pin")] != [first], "the evicted one deleted"
                # the next one is evicted and its replacement never holds: nothing is claimed held then
                fake.control("pin-words", words="")
                second = (await pool.page_cache_pins())[0]["name"]
                fake.control("evict", name=second)
                assert await eventually(lambda: _claims_none(pool))
                await asyncio.sleep(1.5)  # the replacement's PIN_TIMEOUT passes
                assert await pool.page_cache_pins() == [] and pool.pins_lost == 2
    finally:
        await api.close()


async def _claims_none(pool) -> bool:
    return await pool.page_cache_pins() == []


async def test_pins_are_outside_a_quota_scoped_not_best_effort_and_refused_by_an_unscoped_one(fake):
    api = await api_of(fake)
    try:
        await api.create("resourcequotas", m.resource_quota("air", pods=1))
        # two runs, two run ids (AIR_RUN_ID gives every pool of the suite one: the second would adopt the first's
        # objects, which the garbage collector is deleting with the first's Lease)
        async with pool_of(fake, run_id="pins-scoped") as pool:
            async with pool.lease(SPEC):
                assert len(await pods(api, "pin")) == 1 and len(await pods(api, "agent")) == 1
        await api.delete("resourcequotas", "air-slots")
        unscoped = m.resource_quota("air", pods=1)
        del unscoped["spec"]["scopes"]
        await api.create("resourcequotas", unscoped)
        async with pool_of(fake, run_id="pins-unscoped") as pool:
            with pytest.raises(InfraError, match="refused by the namespace's quota.*NotBestEffort"):
                async with pool.lease(SPEC):
                    pass
    finally:
        await api.close()


async def test_a_run_that_died_leaves_its_pins_to_the_sweep(fake):
    """No close (a SIGKILLed run): its Lease gone, the next sweep takes its pins with its sandboxes."""
    api = await api_of(fake)
    try:
        async with pool_of(fake) as pool:
            async with pool.lease(SPEC):
                pin = (await pods(api, "pin"))[0]["metadata"]["name"]
                # A dead run watches nothing: a live pool's watch would see the sweep take its pin and replace it
                # (a race that made the next line see the replacement on a busy machine)
                await pool.watch.close()
                await api.delete("leases", m.run_lease_name(pool.run_id), grace=None, propagation="Orphan")
                gone = await sweep(api)
                assert pin in gone
                assert await pods(api, "pin") == []
    finally:
        await api.close()


async def test_shared_page_cache_makes_no_pin(fake):
    async with pool_of(fake, page_cache="shared") as pool:
        async with pool.lease(SPEC):
            assert await pool.page_cache_pins() == []
        assert pool.api.calls["GET pods/log"] == 0 and pool.api.calls["POST pods"] == 1
