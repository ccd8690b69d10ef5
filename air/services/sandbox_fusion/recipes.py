"""What air runs per language: the file the code goes to, the compile and run commands, and what the image
must have for the language to be offered (probed once per service by scripts/probe.sh)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files

from air.services.sandbox_fusion.schema import Language


@dataclass(frozen=True)
class Recipe:
    source: str
    """File the code is written to, in the request's directory (it wins over a request file of that name)."""
    run: str
    compile: str | None = None
    needs: tuple[str, ...] = ()
    """Commands that must be on the sandbox's PATH (probed once); `py:<module>` is a python3 module."""


RECIPES: dict[str, Recipe] = {
    "python": Recipe("main.py", "python3 main.py", needs=("python3",)),
    "pytest": Recipe("test_main.py", "python3 -m pytest -q -p no:cacheprovider test_main.py",
                     needs=("python3", "py:pytest")),
    "bash": Recipe("main.sh", "bash main.sh", needs=("bash",)),
    "perl": Recipe("main.pl", "perl main.pl", needs=("perl",)),
    "ruby": Recipe("main.rb", "ruby main.rb", needs=("ruby",)),
    "php": Recipe("main.php", "php main.php", needs=("php",)),
    "lua": Recipe("main.lua", "lua main.lua", needs=("lua",)),
    "R": Recipe("main.R", "Rscript main.R", needs=("Rscript",)),
    "julia": Recipe("main.jl", "julia main.jl", needs=("julia",)),
    "racket": Recipe("main.rkt", "racket main.rkt", needs=("racket",)),
    "nodejs": Recipe("main.js", "node main.js", needs=("node",)),
    "typescript": Recipe("main.ts", "tsx main.ts", needs=("tsx",)),
    "sql": Recipe("main.sql", "sqlite3 -bail :memory: '.read main.sql'", needs=("sqlite3",)),
    "cpp": Recipe("main.cpp", "./main", compile="g++ -std=c++17 -O2 -o main main.cpp", needs=("g++",)),
    "go": Recipe("main.go", "./main", compile="go build -o main main.go", needs=("go",)),
    "rust": Recipe("main.rs", "./main", compile="rustc -O -o main main.rs", needs=("rustc",)),
    "java": Recipe("Main.java", "java -cp . Main", compile="javac Main.java", needs=("javac", "java")),
    "swift": Recipe("main.swift", "./main", compile="swiftc -O -o main main.swift", needs=("swiftc",)),
    "verilog": Recipe("main.v", "vvp main", compile="iverilog -o main main.v", needs=("iverilog", "vvp")),
}
"""What air runs per language. The other SandboxFusion languages (test harnesses such as junit or jest, GPU
runners) are answered Failed with a message that says so."""


def script(name: str) -> str:
    """A shell script shipped in this package's scripts/ (kept as files, so shellcheck reads them)."""
    return files(__package__).joinpath("scripts", name).read_text()


def probe_argv() -> list[str]:
    """The command that prints, one a line, every need of RECIPES the sandbox meets."""
    needs = sorted({need for recipe in RECIPES.values() for need in recipe.needs})
    return ["sh", "-c", script("probe.sh"), "probe.sh", *needs]


def availability(found: set[str], image: str) -> dict[str, str]:
    """Every SandboxFusion language -> '' when it runs here (its needs are in `found`), else why not."""
    available = {}
    for language in Language.__args__:
        recipe = RECIPES.get(language)
        if recipe is None:
            available[language] = "air's SandboxFusion service does not run this language"
            continue
        missing = [need.removeprefix("py:") for need in recipe.needs if need not in found]
        available[language] = (f"needs {', '.join(missing)}, which image {image} does not have" if missing
                               else "")
    return available
