"""`air containers`: air's containers and claims, and removing what dead runs left."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from air.cli.app import JsonFlag, out, print_json, show_table

containers_app = typer.Typer(help="List and remove air's containers, including those of dead runs.",
                             no_args_is_help=True)

@containers_app.command("ls")
def containers_ls(
    run: Annotated[str | None, typer.Option(help="Only this run id.")] = None,
    claims: Annotated[bool, typer.Option("--claims", help="Also list the host-wide claims (budget slots, GPUs).")]
    = False,
    as_json: JsonFlag = False,
) -> None:
    """List air's containers with their run, task, role, GPUs and whether the run that made them is still alive.

    Example: air containers ls --json
    """
    if _on_enroot():
        _no_run_on_enroot(run)
        _enroot_ls(as_json)
        return
    from air.sandbox import GPUS, connect, list_air_containers

    rows = list_air_containers(connect(), run=run)
    shown = [r for r in rows if claims or not r.claim]
    if as_json:
        print_json([{k: v for k, v in r.__dict__.items()} | {"kept": r.kept, "gpus": r.labels.get(GPUS, "")}
                    for r in shown])
        return
    table = Table("id", "name", "status", "run", "task", "role", "gpus", "owner")
    for r in shown:
        owner = "[green]alive[/]" if r.alive_owner else ("[yellow]dead, kept[/]" if r.kept else "[red]dead[/]")
        table.add_row(r.id, r.name, r.status, r.run, r.task, r.role, r.labels.get(GPUS, ""), owner)
    show_table(table)  # through a pipe, ids and names whole (rich cut them to 80 columns)
    hidden = len(rows) - len(shown)
    if hidden:
        out.print(f"{hidden} host-wide claim(s) not shown (--claims lists them)")


@containers_app.command("clean")
def containers_clean(
    all_: Annotated[bool, typer.Option("--all", help="Remove every air container, live runs and kept ones "
                                                     "included.")] = False,
    run: Annotated[str | None, typer.Option(help="Remove the containers of this run id.")] = None,
    kept: Annotated[bool, typer.Option("--kept", help="Also remove containers kept by `air debug --keep`.")]
    = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove the containers of dead runs (found by label; no state file needed) and the claims nobody holds,
    or --all / --run ID; containers kept by `air debug --keep` stay unless --kept.

    Example: air containers clean --kept
    """
    if _on_enroot():
        _no_run_on_enroot(run)
        _enroot_clean(all_, as_json)
        return
    from air.sandbox import connect, list_air_containers, remove_containers, sweep_stale_claims
    from air.sandbox.docker.cleanup import sweep_dead_networks, sweep_unused_copies

    client = connect()
    rows = list_air_containers(client, run=run)
    # A running host pin is no run's: live processes of any run may rely on it, and it exits once none does.
    doomed = [r.id for r in rows if all_ or (not r.claim and not (r.host_pin and r.status not in ("exited", "dead"))
                                             and (run or (not r.alive_owner and (kept or not r.kept))))]
    removed = remove_containers(client, doomed)
    if run or all_:  # the claims of what went are stale now, whoever made them
        removed += remove_containers(client, [r.id for r in rows if r.claim and r.id not in removed])
    removed += sweep_stale_claims(client)
    removed += sweep_dead_networks(client, run=run, everything=all_)  # services' private networks (docs/harbor.md)
    copies = sweep_unused_copies(client)  # images' tmpfs copies nothing uses (a daemon stopped while pins ran)
    left = [r for r in list_air_containers(client) if not r.claim]
    if as_json:
        print_json({"removed": removed, "copies": copies, "kept": len(left)})
    else:
        out.print(f"removed {len(removed)} container(s) and claim(s)" +
                  (f" and {len(copies)} unused image copies" if copies else "") +
                  f"; {len(left)} container(s) left (live runs{'' if kept or all_ else ', kept ones'})")


# ----- the enroot backend (AIR_BACKEND=enroot): this user's sandboxes on this node -----------------------------------
def _on_enroot() -> bool:
    from air.sandbox import PoolConfig

    return PoolConfig().backend == "enroot"


def _no_run_on_enroot(run: str | None) -> None:
    if run:
        from air.errors import UsageError

        raise UsageError("--run is Docker's: on enroot `air containers ls` shows each sandbox's run and whether it "
                         "lives, and `air containers clean` removes those of dead runs")


def _enroot_ls(as_json: bool) -> None:
    """This user's enroot sandboxes (air/sandbox/enroot/leftovers.py): what each left, and whether its run lives."""
    from air.sandbox.enroot import leftovers
    from air.sandbox.enroot.pool import housekeeping

    launcher, _ = housekeeping()
    rows = leftovers.find(launcher)
    if as_json:
        print_json([{"name": r.name, "task": r.task, "run": r.run, "alive": r.alive, "root": r.root,
                     "directory": str(r.directory) if r.directory else None, "cgroups": [str(c) for c in r.cgroups]}
                    for r in rows])
        return
    table = Table("name", "task", "run", "owner", "root", "host directory", "cgroups")
    for r in rows:
        table.add_row(r.name, r.task, r.run or "", "[green]alive[/]" if r.alive else "[red]dead[/]",
                      "yes" if r.root else "",
                      str(r.directory or ""), ", ".join(c.parent.parent.name for c in r.cgroups))
    show_table(table)


def _enroot_clean(everything: bool, as_json: bool) -> None:
    import asyncio

    from air.sandbox.enroot import leftovers
    from air.sandbox.enroot.pool import housekeeping, sweep, sweep_copies

    launcher, environ = housekeeping()
    removed = asyncio.run(sweep(launcher, environ, everything=everything))
    freed = asyncio.run(sweep_copies(environ))  # the images' roots on /dev/shm no pool uses: the node's memory
    left = leftovers.find(launcher)
    if as_json:
        print_json({"removed": removed, "kept": len(left), "image_roots_removed": freed})
    else:
        out.print(f"removed {len(removed)} enroot sandbox(es) (roots, host directories, cgroup folders); {len(left)} "
                  f"left (live runs); {len(freed)} image root(s) no run uses freed from /dev/shm")
