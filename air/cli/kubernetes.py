"""`air kubernetes`: what a cluster's administrator applies once for air (`setup`), and the sweep of runs that ended
without cleaning up (`clean`). The backend itself is chosen by `PoolConfig.backend` (AIR_BACKEND=kubernetes)."""

from __future__ import annotations

import asyncio
import json
import re
import sys

import typer
import yaml

from air.cli.app import JsonFlag, out, print_json
from air.errors import UsageError
from air.variables import dns_label

kubernetes_app = typer.Typer(help="Set up a Kubernetes namespace for air's sandboxes, and sweep what dead runs left.",
                             no_args_is_help=True)


@kubernetes_app.command()
def setup(namespace: str = typer.Option("air", help="where air's pods go"),
          slots: int = typer.Option(..., min=1, help="pods at most at once in the namespace (its ResourceQuota)"),
          service_account: str = typer.Option("air-env-server", help="the env servers' service account"),
          service_account_namespace: str = typer.Option(None, help="its namespace (default: --namespace)"),
          as_json: JsonFlag = False) -> None:
    """Print the namespace (Pod Security privileged: cells need SYS_ADMIN), its ResourceQuota and the env servers'
    Role, as YAML for kubectl.

    Example: air kubernetes setup --slots 1100 | kubectl apply -f -
    """
    from air.sandbox.kubernetes.manifests import cluster_setup

    # Names kubectl would refuse are said here, before a manifest is printed (kubectl's error comes too late for
    # `| kubectl apply -f -` to undo the documents before it).
    _name("--namespace", namespace, dns_label)
    _name("--service-account", service_account, _subdomain)
    if service_account_namespace is not None:
        _name("--service-account-namespace", service_account_namespace, dns_label)
    documents = cluster_setup(namespace, slots=slots, service_account=service_account,
                              sa_namespace=service_account_namespace)
    if as_json:
        print_json(documents)
    else:
        # Through sys.stdout and flushed here (click's echo went past it to the buffer, and a full device at exit
        # was never said): `> /dev/full` is a full disk, exit 3, as for every other command's output
        sys.stdout.write(yaml.safe_dump_all(documents, sort_keys=False))
        sys.stdout.flush()


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _subdomain(text: str) -> str:
    """A DNS-1123 subdomain (a service account's name): labels joined by dots, 253 characters at most."""
    if len(text) > 253 or not _SUBDOMAIN.fullmatch(text):
        raise ValueError("is not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', 253 at most)")
    return text


def _name(flag: str, text: str, check) -> None:
    try:
        check(text)
    except ValueError as exc:
        raise UsageError(f"{flag} {text!r} {exc}; kubectl would refuse it") from None


@kubernetes_app.command()
def clean(namespace: str = typer.Option(None, help="default: PoolConfig's (AIR_KUBERNETES_NAMESPACE, else air)"),
          as_json: JsonFlag = False) -> None:
    """Delete the runs whose Lease expired (their pods, Secrets and the rest follow by the garbage collector) and
    pods of runs without a Lease; pods kept by `air debug --keep` stay.

    Example: air kubernetes clean --namespace air
    """
    from air.sandbox.kubernetes.api import KubeApi
    from air.sandbox.kubernetes.config import KubernetesConfig
    from air.sandbox.kubernetes.sweep import sweep

    config = KubernetesConfig(**({"namespace": namespace} if namespace else {}))

    async def run() -> list[str]:
        api = KubeApi(config)
        try:
            await api.open()
            return await sweep(api)
        finally:
            await api.close()

    swept = asyncio.run(run())
    if as_json:
        print_json(swept)
    else:
        out.print(f"removed {len(swept)} object(s) of ended runs in {config.namespace}" +
                  (": " + json.dumps(swept) if swept else ""))
