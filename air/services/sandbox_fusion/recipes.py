"""What air runs per language, as SandboxFusion's runners do (sandbox/runners/major.py and minor.py upstream):
the same compilers and flags, test runners, class paths and output names, so a program that passes or fails
there passes or fails here. Also what the image must have for a language to be offered (probed once per service
by scripts/probe.sh) and, for a language this image lacks, which image serves it.

Where the code goes: upstream writes it to a fresh temporary file (`tmpXXXXXXXX.py`) after the request's files,
so an uploaded file is never overwritten; Java (`Main.java`) and JUnit (`<public class>.java`) use fixed names, and
there the code replaces an upload of that name, as upstream.
"""

from __future__ import annotations

import functools
import re
import secrets
import string
from collections.abc import Callable, Collection
from dataclasses import dataclass
from importlib.resources import files

from air.services.sandbox_fusion.schema import Language

TOOLCHAIN_IMAGE = "air/toolchain:latest"
"""The image of images/toolchain: Debian's compilers and interpreters for SandboxFusion's languages."""
SERVE_TOOLCHAIN = f"`air images build toolchain` then `air serve sandbox-fusion --image {TOOLCHAIN_IMAGE}`"

# Debian's jars (images/toolchain): javatuples as upstream ships it, JUnit 5's console launcher and API.
JAVATUPLES = "/usr/share/java/javatuples.jar"
JUNIT_CONSOLE = "/usr/share/java/junit-platform-console-standalone.jar"
JUNIT_API = "/usr/share/java/junit-jupiter-api.jar"
# Go without a module (upstream's go.mod pins modules fetched from the network): GOPATH mode over Debian's Go
# sources, where testify lives, as go_test programs expect.
GO_ENV = "env GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= "


class CompileRefused(Exception):
    """Upstream's runner refuses the code before compiling it (a Scala program without an object): answered as
    upstream does, SandboxError with a compile result of status Error and this message, no run."""


@dataclass(frozen=True)
class Recipe:
    suffix: str
    """The code goes to a fresh `tmpXXXXXXXX<suffix>` in the request's directory (never an uploaded file's name)."""
    run: str
    """Shell command; {src} is the code's file, {cp} the class path, {main} the class or object to run."""
    compile: str | None = None
    needs: tuple[str, ...] = ()
    """Commands that must be on the sandbox's PATH (probed once); `py:<module>` is a python3 module; a path
    (starting with /) must exist."""
    source: Callable[[str], str | None] | None = None
    """The code's file name from the code, instead of a temporary one (None: the code is not written)."""
    class_path: Callable[[Collection[str]], str] | None = None
    """{cp} from the request's relative file names."""
    main: Callable[[str], str] | None = None
    """{main} from the code; may raise CompileRefused."""
    transform: Callable[[str], str] | None = None
    """The code as written (PHP gets its `<?php` tag)."""
    warm: bool = False
    """`run` is `python3 {src}`: a fork of a python3 that has started may run it (air/sandbox/warden/zygote.py)."""

    def source_name(self, code: str, taken: Collection[str]) -> str | None:
        if self.source is not None:
            return self.source(code)
        while True:  # as Python's tempfile names: tmp + 8 random characters
            name = "tmp" + _random_chars() + self.suffix
            if name not in taken:
                return name


_ALPHABET = string.ascii_lowercase + string.digits + "_"
_NAMES = len(_ALPHABET) ** 8


def _random_chars() -> str:
    """8 characters of _ALPHABET, each uniform, from one draw of the system's randomness (secrets.choice for each
    was 8 getrandom calls a request). 42 random bits below 37**8 (about 4 draws in 5), read as 8 digits."""
    while True:
        number = secrets.randbits(42)
        if number < _NAMES:
            break
    chars = []
    for _ in range(8):
        number, digit = divmod(number, len(_ALPHABET))
        chars.append(_ALPHABET[digit])
    return "".join(chars)


def _jars(files: Collection[str]) -> list[str]:
    """Uploaded jars go on the class path by their request-relative names, as upstream."""
    return [name for name in files if name.endswith(".jar")]


def _java_cp(files: Collection[str]) -> str:
    return ":".join([".", JAVATUPLES, *_jars(files)])


def _junit_cp(files: Collection[str]) -> str:
    return ":".join([".", JUNIT_CONSOLE, JUNIT_API, *_jars(files)])


_PUBLIC_CLASS = re.compile(r"\bpublic\s+(?:abstract\s+|final\s+)?class\s+(\w+)")
# Upstream takes the first of `object NAME` and ` extends NAME {`, and has a name only when that is an object:
# `class A extends B {` before the object is refused there too.
_SCALA_OBJECT = re.compile(r"object\s+(\w+)|\s+extends\s+\w+\s*\{")


def _junit_source(code: str) -> str | None:
    if not code:  # upstream writes no file for empty code (the uploaded files are the tests)
        return None
    found = _PUBLIC_CLASS.search(code)
    return f"{found.group(1) if found else 'Main'}.java"


def _scala_object(code: str) -> str:
    found = _SCALA_OBJECT.search(code)
    if not found or not found.group(1):
        raise CompileRefused("Object name not found.")
    return found.group(1)


def _php_tag(code: str) -> str:
    code = code.lstrip()
    return code if code.startswith("<?php") else "<?php\n" + code


CPP_LIBS = "-lcrypto -lssl -lpthread"  # upstream links these when its g++ can (the toolchain image can)

RECIPES: dict[str, Recipe] = {
    "python": Recipe(".py", "python3 {src}", needs=("python3",), warm=True),
    "pytest": Recipe(".py", "python3 -m pytest -p no:cacheprovider {src}", needs=("python3", "py:pytest")),
    "bash": Recipe(".sh", "/bin/bash {src}", needs=("bash",)),
    "perl": Recipe(".pl", "perl {src}", needs=("perl",)),
    "ruby": Recipe(".rb", "ruby {src}", needs=("ruby",)),
    "php": Recipe(".php", "php -f {src}", needs=("php",), transform=_php_tag),
    "lua": Recipe(".lua", "lua {src}", needs=("lua",)),
    "R": Recipe(".R", "Rscript {src}", needs=("Rscript",)),
    "racket": Recipe(".rkt", "racket {src}", needs=("racket",)),
    "nodejs": Recipe(".js", "node {src}", needs=("node",)),
    # upstream runs tsx: transpile without type checking, as ts-node --transpile-only does.
    "typescript": Recipe(".ts", "ts-node --transpile-only {src}", needs=("ts-node",)),
    # not an upstream runner (its `sql` has none): SQLite on a fresh in-memory database.
    "sql": Recipe(".sql", "sqlite3 -bail :memory: \".read {src}\"", needs=("sqlite3",)),
    "cpp": Recipe(".cpp", "./test", compile=f"g++ -std=c++17 {{src}} -o test {CPP_LIBS}", needs=("g++",)),
    "go": Recipe(".go", "./out", compile=GO_ENV + "go build -o out {src}", needs=("go",)),
    "go_test": Recipe("_test.go", GO_ENV + "go test {src}", needs=("go",)),
    "rust": Recipe(".rs", "./test", compile="rustc {src} -o test", needs=("rustc",)),
    "D_ut": Recipe(".d", "./test", compile="ldmd2 {src} -unittest -of=test", needs=("ldmd2",)),
    "java": Recipe(".java", "java -cp {cp} -ea Main", compile="javac -cp {cp} Main.java",
                   needs=("javac", "java", JAVATUPLES), source=lambda code: "Main.java", class_path=_java_cp),
    "junit": Recipe(".java", f"java -jar {JUNIT_CONSOLE} --class-path {{cp}} --scan-class-path",
                    compile="javac -cp {cp} *.java", needs=("javac", "java", JUNIT_CONSOLE, JUNIT_API),
                    source=_junit_source, class_path=_junit_cp),
    "scala": Recipe(".scala", "scala {main}", compile="scalac {src}", needs=("scalac", "scala"), main=_scala_object),
    # the test bench's top module is `tb`, as in upstream (after NVlabs' verilog-eval).
    "verilog": Recipe(".sv", "vvp -n test.vvp",
                      compile="iverilog -Wall -Winfloop -Wno-timescale -g2012 -s tb -o test.vvp {src}",
                      needs=("iverilog", "vvp")),
}

NOT_SERVED: dict[str, str] = {
    "csharp": "SandboxFusion runs C# with the .NET SDK (`dotnet new console`, `dotnet run`), which Debian does not "
              "package; mono's C# 7 compiler rejects the top-level programs that template makes",
    "kotlin_script": "Debian's Kotlin is 1.3 and pulls 127 packages (580 MB); not in air's toolchain image",
    "jest": "jest runs TypeScript tests through Babel and SandboxFusion's npm packages; not in air's toolchain image",
    "julia": "Debian bookworm does not package Julia",
    "swift": "Debian bookworm does not package Swift",
    "lean": "Debian bookworm does not package Lean 4 (SandboxFusion builds against Mathlib with lake)",
    "cuda": "needs a GPU and CUDA, which air's CPU images lack",
    "python_gpu": "needs a GPU and CUDA, which air's CPU images lack",
}
"""Why air serves no recipe for these languages."""


@functools.cache
def script(name: str) -> str:
    """A script shipped in this package's scripts/ (kept as files, so shellcheck and ruff read them); read once,
    as requests send it."""
    return files(__package__).joinpath("scripts", name).read_text()


def probe_argv() -> list[str]:
    """The command that prints, one a line, every need of RECIPES the sandbox meets."""
    needs = sorted({need for recipe in RECIPES.values() for need in recipe.needs})
    return ["sh", "-c", script("probe.sh"), "probe.sh", *needs]


def availability(found: set[str], image: str) -> dict[str, str]:
    """Every SandboxFusion language -> '' when it runs here (its needs are in `found`), else why not, with the
    image that serves it when there is one."""
    available = {}
    for language in Language.__args__:
        recipe = RECIPES.get(language)
        if recipe is None:
            available[language] = (f"air's SandboxFusion service does not run it: "
                                   f"{NOT_SERVED.get(language, 'no recipe')}")
            continue
        missing = [need.removeprefix("py:") for need in recipe.needs if need not in found]
        if not missing:
            available[language] = ""
        elif image == TOOLCHAIN_IMAGE:
            available[language] = f"needs {', '.join(missing)}, which image {image} does not have"
        else:
            available[language] = (f"needs {', '.join(missing)}, which image {image} does not have; "
                                   f"image {TOOLCHAIN_IMAGE} serves it: {SERVE_TOOLCHAIN}")
    return available


def image_languages(client, image: str) -> list[str]:
    """The SandboxFusion languages an image serves, probed once per image id in a throwaway container (no
    network, the agent's uid) and cached on the host, so `air images ls` and `air doctor` stay cheap."""
    import json

    from air import paths
    from air.sandbox import make_labels

    image_id = client.images.get(image).id.split(":")[-1]
    cache = paths.cache_dir() / "sandbox-fusion-languages" / f"{image_id}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    out = client.containers.run(image_id, probe_argv(), remove=True, network_mode="none", user="1000",
                                labels=make_labels("probe"))
    found = set(out.decode().split())
    languages = [lang for lang, why in availability(found, image).items() if not why]
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(languages))
    return languages
