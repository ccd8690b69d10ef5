"""Task images, built offline from the recipes in `images/` (`air images build`).

The runtime (air/sandbox) needs only an image's reference; this package makes the images: `recipes.py` reads the
recipes and names their tags, `builder.py` stages wheels and Debian packages on the host and builds with the network
off (bootstrapping a Debian base where no registry is reachable), `debs.py` stages the .debs.

    from air.images import ImageBuilder, image_ref
    ImageBuilder(connect()).ensure(["base", "cpu"])   # built, or reused when nothing changed
    image_ref("cpu")                                  # -> "air/cpu:latest"
"""

from air.images.builder import BuiltImage, ImageBuilder, list_images
from air.images.recipes import REPO, Recipe, build_command, build_order, image_ref, load_recipes

__all__ = ["BuiltImage", "ImageBuilder", "REPO", "Recipe", "build_command", "build_order", "image_ref",
           "list_images", "load_recipes"]
