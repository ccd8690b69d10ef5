"""`air data`: Hugging Face datasets staged into air's local read-only store, for task containers with no network.

    air data add uoft-cs/cifar10 --from ~/cifar10-saved     # a save_to_disk folder or a hub snapshot
    air data ls
    air data rm uoft-cs/cifar10
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from air.cli.app import PATH, JsonFlag, out, print_json, show_table

data_app = typer.Typer(help="Stage Hugging Face datasets into air's local read-only store (task containers read "
                            "them offline with load_dataset).", no_args_is_help=True)
Store = Annotated[Path | None, typer.Option("--store", **PATH, help="The store (default: $AIR_DATA_DIR, else "
                                                            "~/.cache/air/data).")]


def _store(store: Path | None):
    from air.tasks.datastore import DataStore

    return DataStore(store)


@data_app.command("add")
def data_add(
    name: Annotated[str, typer.Argument(help="The dataset's hub id, as the task's code loads it (ORG/NAME).")],
    source: Annotated[Path, typer.Option("--from", **PATH, help="A folder written by `save_to_disk`, or a hub snapshot "
                                                        "(parquet/arrow/csv/json files) that load_dataset reads.")],
    image: Annotated[str, typer.Option(help="Task image whose `datasets` converts it (the one tasks read with).")]
    = "cpu",
    replace: Annotated[bool, typer.Option(help="Replace a dataset of that id already in the store.")] = False,
    store: Store = None,
    as_json: JsonFlag = False,
) -> None:
    """Convert a dataset into the store (in a container, network off); task containers then load it by its id.

    Example: air data add uoft-cs/cifar10 --from ~/cifar10-saved
    """
    from air.images import image_ref

    added = _store(store).add(name, source, image=image_ref(image), replace=replace)
    if as_json:
        print_json(added.__dict__)
        return
    out.print(f"added {added.id}: {', '.join(f'{s} {n} rows' for s, n in added.splits.items())}, "
              f"{added.size_mb:.1f} MB")


@data_app.command("ls")
def data_ls(store: Store = None, as_json: JsonFlag = False) -> None:
    """List the datasets in the store.

    Example: air data ls --json
    """
    rows = _store(store).ls()
    if as_json:
        print_json([r.__dict__ for r in rows])
        return
    if not rows:
        out.print(f"no dataset in the store ({_store(store).root}); stage one with `air data add ID --from DIR`")
        return
    table = Table("dataset", "splits (rows)", "MB", "from", "added")
    for r in rows:
        table.add_row(r.id, " ".join(f"{s}={n}" for s, n in r.splits.items()), f"{r.size_mb:.1f}", r.source,
                      r.added)
    show_table(table)


@data_app.command("rm")
def data_rm(name: Annotated[str, typer.Argument(help="The dataset's hub id.")], store: Store = None,
            as_json: JsonFlag = False) -> None:
    """Remove a dataset from the store.

    Example: air data rm uoft-cs/cifar10 --json
    """
    _store(store).rm(name)
    if as_json:
        print_json({"removed": name})
        return
    out.print(f"removed {name}")
