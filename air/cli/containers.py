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
    from air.sandbox import connect, list_air_containers, remove_containers, sweep_stale_claims
    from air.sandbox.cleanup import sweep_dead_networks

    client = connect()
    rows = list_air_containers(client, run=run)
    doomed = [r.id for r in rows if all_ or (not r.claim and (run or (not r.alive_owner and (kept or not r.kept))))]
    removed = remove_containers(client, doomed)
    if run or all_:  # the claims of what went are stale now, whoever made them
        removed += remove_containers(client, [r.id for r in rows if r.claim and r.id not in removed])
    removed += sweep_stale_claims(client)
    removed += sweep_dead_networks(client, run=run, everything=all_)  # services' private networks (docs/harbor.md)
    left = [r for r in list_air_containers(client) if not r.claim]
    if as_json:
        print_json({"removed": removed, "kept": len(left)})
    else:
        out.print(f"removed {len(removed)} container(s) and claim(s); {len(left)} container(s) left (live runs"
                  f"{'' if kept or all_ else ', kept ones'})")
