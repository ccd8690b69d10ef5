"""`air images`: build task images offline and list what is built, with what each serves."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from air.cli.app import JsonFlag, console, out, print_json, show_table

images_app = typer.Typer(help="Build and list task images (offline, from recipes in images/).", no_args_is_help=True)

@images_app.command("build")
def images_build(
    recipes: Annotated[list[str] | None, typer.Argument(help="Recipes to build (default: every CPU recipe).")] = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="Also build the GPU recipes (CUDA torch); for GPU hosts.")] = False,
    base: Annotated[str, typer.Option(help="Base image of the root recipe; 'auto' = python:3.11-slim if it can "
                                           "be had, else a Debian base bootstrapped offline.")] = "auto",
    pip_arg: Annotated[list[str] | None, typer.Option("--pip-arg", help="Extra argument for `pip download` "
                                                      "when staging wheels (repeatable).")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if an image with the same recipe hash exists.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Build task images with the network off, from wheels staged on the host. Idempotent.

    Example: air images build cpu
    """
    from air.images import load_recipes

    all_recipes = load_recipes()
    names = recipes or [n for n, r in all_recipes.items() if (gpu or not r.gpu) and r.default]
    built = ensure_images(names, base=base, pip_args=pip_arg or [], force=force)
    if as_json:
        print_json([b.__dict__ for b in built])
        return
    for b in built:
        verb = "reused" if b.reused else "built"
        out.print(f"{verb:>6}  {b.tag:<28} {b.id.split(':')[-1][:12]}  {b.size_mb:7.0f} MB")


def ensure_images(names: list[str], *, force: bool = False, quiet_reuse: bool = False, **options) -> list:
    """Build or reuse images with progress: a spinner on a terminal, plain lines elsewhere (CI, `| tee`), where a
    spinner prints nothing for the minutes of a first build; the repetitive lines there are rate-limited."""
    from air.cli.progress import PlainProgress
    from air.images import ImageBuilder
    from air.sandbox import connect

    client = connect()
    if console.is_terminal and not console.is_dumb_terminal:
        with console.status("checking images") as status:
            def report(line: str) -> None:
                # escape: the lines start with "[recipe]", which rich would take for markup and drop.
                if line.startswith("warning"):
                    console.print(f"[yellow]{escape(line)}[/]")
                status.update(escape(line))

            return ImageBuilder(client, report=report, **options).ensure(names, force=force)

    def write(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with PlainProgress(write) as progress:
        def stage(line: str) -> None:  # `air run` says nothing about images it merely reuses
            if not (quiet_reuse and " reused " in line):
                progress.stage(line)

        return ImageBuilder(client, report=stage, detail=progress.detail, **options).ensure(names, force=force)


def missing_images(images: Iterable[str]) -> list[str]:
    """The images (recipe names or references) that are not on the daemon."""
    import docker.errors

    from air.images import image_ref
    from air.sandbox import PoolConfig, connect

    if PoolConfig().backend == "enroot":  # no daemon: the squashfs files are the images; none is built here
        enroot_images([image_ref(image) for image in images])
        return []

    client = connect()
    try:
        missing = []
        for image in dict.fromkeys(images):
            try:
                client.images.get(image_ref(image))
            except docker.errors.ImageNotFound:
                missing.append(image)
        return missing
    finally:
        client.close()


def enroot_images(refs: list[str]) -> None:
    """The enroot backend's images are squashfs files made where Docker is (`air images export-squashfs`): a missing
    one is one line naming that command (ImageError), before any rollout."""
    from air import squashfs

    for ref in dict.fromkeys(refs):
        squashfs.resolve(ref)


def build_task_images(specs) -> None:
    """The images of tasks that bring their own Dockerfile (Harbor tasks), built now with progress unless present:
    one that cannot be built is one line naming its failed step, before any rollout."""
    from air.cli.progress import PlainProgress
    from air.sandbox import PoolConfig
    from air.tasks.task_images import build_task_image

    if PoolConfig().backend == "enroot":  # no daemon to build with: the exported squashfs files are the images
        enroot_images([spec.image for spec in specs if spec.build is not None])
        return
    for spec in specs:
        if spec.build is None:
            continue
        with PlainProgress(lambda line: print(line, file=sys.stderr, flush=True)) as progress:
            build_task_image(spec, report=progress.detail)


def require_images(images: Iterable[str]) -> None:
    """Each image must be on the daemon before a command that runs it starts (`air eval`, `air serve`): a missing
    one would fail every rollout or request that needs it, as infrastructure. The line names its build command."""
    from air.errors import ImageError
    from air.images import image_ref

    for image in missing_images(images):
        raise ImageError.not_built(image_ref(image))


def build_missing(images: list[str]) -> None:
    """`air run`'s images: one that is built is used as it is (never staged or rebuilt again: keeping images
    current is `air images build`'s job); a missing one is built, except a CUDA one on a host without a GPU, which
    is refused with the command that builds it on purpose."""
    from air.errors import ImageError
    from air.images import image_ref, load_recipes
    from air.sandbox.gpus import detect_gpus

    missing = missing_images(images)
    recipes = load_recipes()
    for image in missing:
        recipe = recipes.get(image)
        if recipe is None:
            raise ImageError.not_built(image_ref(image))
        if recipe.gpu and not detect_gpus():
            raise ImageError(f"image {image_ref(image)} is a CUDA image and this host has no GPU (nvidia-smi); air "
                             f"builds it only when asked: `air images build {image}`")
    if missing:
        ensure_images(missing, quiet_reuse=True)


@images_app.command("ls")
def images_ls(as_json: JsonFlag = False) -> None:
    """List air's images (every recipe build still on the daemon).

    Example: air images ls --json
    """
    from air.images import build_command, image_ref, list_images, load_recipes
    from air.sandbox import connect

    client = connect()
    rows = list_images(client)
    for row in rows:  # what `air serve sandbox-fusion --image` would offer on a current build (probed once per id)
        row["sandbox_fusion_languages"] = (sandbox_fusion_languages(client, image_ref(row["recipe"]))
                                           if row["current"] else [])
    built = {r["recipe"] for r in rows if r["current"]}
    # A row per recipe not built (the MLGym stacks are optional): what it is for and the command that builds it.
    missing = [{"recipe": name, "tags": [], "id": "", "size_mb": 0.0, "created": "", "missing": True,
                "build": build_command(recipe), "description": recipe.description}
               for name, recipe in sorted(load_recipes().items()) if name not in built]
    if as_json:
        print_json(rows + missing)
        return
    # Fits 80 columns: a build is its recipe's current one (`latest`) or an older one still on the daemon; what an
    # image serves to `air serve sandbox-fusion` goes under the table.
    table = Table("recipe", "build", "id", "MB", "created")
    languages = []
    for r in rows:
        table.add_row(r["recipe"], "latest" if r["current"] else "older" if r["tags"] else "<untagged>", r["id"][:12],
                      f"{r['size_mb']:.0f}", r["created"][:16].replace("T", " "))
        if r["sandbox_fusion_languages"]:
            languages.append(f"{image_ref(r['recipe'])} serves {', '.join(r['sandbox_fusion_languages'])}")
    for r in missing:
        table.add_row(r["recipe"], "[yellow]missing[/]", "", "", "")
    show_table(table)
    for r in missing:
        out.print(f"{r['recipe']} is not built: {r['build']}", overflow="fold")
    for line in languages:
        out.print(f"SandboxFusion languages: {line}", overflow="fold")


@images_app.command("export-squashfs")
def images_export_squashfs(
    images: Annotated[list[str], typer.Argument(help="Image references (air/cpu:latest, a Harbor task's, ...).")],
    as_json: JsonFlag = False,
) -> None:
    """Write images as squashfs files for the enroot backend (AIR_SQUASHFS_DIR; a node without Docker runs them).

    Example: air images export-squashfs air/base:latest air/cpu:latest
    """
    from air.images.squashfs import export
    from air.sandbox import connect

    client = connect()
    done = [export(client, ref) for ref in images]
    if as_json:
        print_json([{**d.__dict__, "path": str(d.path)} for d in done])
        return
    for d in done:
        verb = "reused" if d.reused else "made"
        out.print(f"{verb:>6}  {d.ref:<28} {d.path}  {d.size / 1e6:6.0f} MB  {d.seconds:5.1f} s", overflow="fold")


def sandbox_fusion_languages(client, tag: str) -> list[str]:
    from air.services.sandbox_fusion.recipes import image_languages

    try:
        return image_languages(client, tag)
    except Exception:  # noqa: BLE001 - an image that cannot run a probe serves nothing; doctor stays a report
        return []
