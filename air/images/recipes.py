"""Image recipes: what `images/<name>/recipe.toml` declares, the order recipes build in, and the tag a task names
its image by. Reading recipes needs no Docker."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from air import paths
from air.errors import ImageError, UsageError
from air.validation import one_line

REPO = "air"


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(exclude=True)
    folder: Path = Field(exclude=True)
    description: str = ""
    parent: str | None = None
    requirements: list[str] = []
    optional: list[str] = []
    # Out of the dump that the image hash covers (build adds them when there are some), so that recipes without
    # Debian packages keep the hash they had before the field existed.
    debs: list[str] = Field([], exclude=True)
    """Debian packages (no recommends) downloaded on the host for the parent's suite, installed by the recipe's
    own Dockerfile from the context's `debs/` folder (see air/images/debs.py)."""
    gpu: bool = False
    default: bool = Field(True, exclude=True)  # out of the hashed dump: older recipes keep their hash
    """Built by a plain `air images build`; false for big stacks only some tasks need (`air images build NAME`)."""

    @property
    def dockerfile(self) -> Path:
        own = self.folder / "Dockerfile"
        return own if own.exists() else self.folder.parent / "Dockerfile.wheels"

    @property
    def needs_wheels(self) -> bool:
        return bool(self.requirements or self.optional)


def image_ref(name: str) -> str:
    """The tag a task names its image by: `cpu` -> `air/cpu:latest`; a full reference is kept as is."""
    return name if ("/" in name or ":" in name) else f"{REPO}/{name}:latest"


def load_recipes(root: Path | None = None, also: Path | None = None) -> dict[str, Recipe]:
    """The recipes of `root` (air's images/), and those of the folder `also` (a test suite's fixture images, built
    on air's own): a name of `also` may not shadow one of `root`."""
    root = root or paths.images_dir()
    recipes: dict[str, Recipe] = {}
    folders = sorted(root.glob("*/recipe.toml")) + (sorted(also.glob("*/recipe.toml")) if also else [])
    for toml_path in folders:
        if toml_path.parent.name in recipes:
            raise ImageError(f"{toml_path}: recipe '{toml_path.parent.name}' is one of {root} already")
        name = toml_path.parent.name
        try:
            data = tomllib.loads(toml_path.read_text())
            recipes[name] = Recipe(name=name, folder=toml_path.parent, **data)
        except tomllib.TOMLDecodeError as exc:
            raise ImageError(f"{toml_path}: TOML syntax error: {exc}") from None
        except ValidationError as exc:
            raise ImageError(one_line(exc, f"{toml_path}: ")) from None
    for recipe in recipes.values():
        if recipe.parent and recipe.parent not in recipes:
            raise ImageError(f"{recipe.folder / 'recipe.toml'}: parent recipe '{recipe.parent}' does not exist")
    return recipes


def build_order(recipes: dict[str, Recipe], names: Iterable[str]) -> list[Recipe]:
    """The recipes asked for, each after its parents."""
    order: list[Recipe] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name not in recipes:
            raise UsageError(f"unknown image recipe '{name}' (known: {', '.join(sorted(recipes))})")
        if name in chain:
            raise ImageError(f"recipe cycle: {' -> '.join((*chain, name))}")
        recipe = recipes[name]
        if recipe.parent:
            visit(recipe.parent, (*chain, name))
        if recipe not in order:
            order.append(recipe)

    for name in names:
        visit(name, ())
    return order


def build_command(recipe: Recipe) -> str:
    return f"air images build {recipe.name}" + (" (on a GPU host)" if recipe.gpu else "")
