"""What SandboxFusion's own server (469de08) and verl's reward code make of an answer, for the tests of air's
SandboxFusion service.

- `verl_result`: the per-test-case result verl's SandboxFusion reward derives from a `/run_code` answer (True,
  False, or -1 api/sandbox error, -2 runtime error, -3 timeout, -4 compile error), written from the fields and
  branches of verl's `verl/utils/reward_score/sandbox_fusion/utils.py` (`_process_single_case`). A difference
  here is a different reward.
- `differs`: air's deliberate differences from upstream's server, declared on the test that proves each one.
  docs/sandbox-fusion.md's table of differences is rendered from these declarations (`python tests/sf_upstream.py`
  writes it; tests/test_sandbox_fusion_upstream.py fails when the two disagree), so a difference cannot be listed
  without a test, or proved without being listed.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

UPSTREAM = "SandboxFusion 469de08"


# ----- verl ------------------------------------------------------------------------------------------------------
def verl_result(http_status: int, answer: dict | None, expected_stdout: str | None = None) -> bool | int:
    """verl's result for one test case from the HTTP status and JSON body of `/run_code`."""
    if http_status != 200 or answer is None:  # verl retries only a 504; any other HTTP error is an API error
        return -1
    status = answer.get("status")
    compiled, ran = answer.get("compile_result"), answer.get("run_result")
    if status == "Success":
        if not ran or ran.get("status") != "Finished":
            return -1
        stdout = ran.get("stdout") or ""
        return expected_stdout is None or stdout.rstrip("\n") == expected_stdout.rstrip("\n")
    if status != "Failed":  # SandboxError, or anything unknown
        return -1
    if compiled and (compiled.get("status") in ("Error", "TimeLimitExceeded")
                     or (compiled.get("status") == "Finished" and compiled.get("return_code") != 0)):
        return -4
    if not ran:
        return -1
    if ran.get("status") == "TimeLimitExceeded":
        return -3
    if ran.get("status") == "Error" or (ran.get("status") == "Finished" and ran.get("return_code") != 0):
        return -2
    return -1


# ----- air's deliberate differences --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Difference:
    behaviour: str
    upstream: str
    air: str
    module: str
    line: int
    test: str
    """tests/<module>.py::<function>"""


DIFFERENCES: dict[str, Difference] = {}
TEST_MODULES = ("test_sandbox_fusion", "test_sandbox_fusion_languages", "test_sandbox_fusion_jupyter",
                "test_sandbox_fusion_compat", "test_sandbox_fusion_inputs", "test_sandbox_fusion_warm")
"""The modules that declare differences (imported to collect them)."""


def differs(behaviour: str, *, upstream: str, air: str):
    """Declare, on the test that proves it, a behaviour in which air deliberately differs from upstream."""
    def mark(test):
        module = test.__module__.rsplit(".", 1)[-1]
        name = f"tests/{module}.py::{test.__name__}"
        DIFFERENCES[name] = Difference(behaviour, upstream, air, module, test.__code__.co_firstlineno, name)
        return test
    return mark


def table() -> str:
    """docs/sandbox-fusion.md's table of differences, one row per declaration."""
    tests_dir = str(Path(__file__).parent)
    if tests_dir not in sys.path:
        sys.path.insert(0, tests_dir)
    for module in TEST_MODULES:
        importlib.import_module(module)
    rows = [f"| behaviour | {UPSTREAM} | air | proved by |", "| --- | --- | --- | --- |"]
    # In the modules' order, then the tests' (whichever order they were imported in).
    for d in sorted(DIFFERENCES.values(), key=lambda d: (TEST_MODULES.index(d.module), d.line)):
        rows.append(f"| {d.behaviour} | {d.upstream} | {d.air} | `{d.test}` |")
    return "\n".join(rows) + "\n"


BEGIN = "<!-- differences from SandboxFusion: rendered by `python tests/sf_upstream.py` from the tests -->\n"
END = "<!-- end of the differences -->\n"
README = Path(__file__).resolve().parent.parent / "docs" / "sandbox-fusion.md"
"""The page that holds the table (the README's reference page on SandboxFusion)."""


def readme_table(text: str) -> str:
    found = re.search(re.escape(BEGIN) + "(.*?)" + re.escape(END), text, re.DOTALL)
    return found.group(1) if found else ""


if __name__ == "__main__":  # rewrite README's table from the tests
    import sf_upstream as registry  # the module the tests import (and declare into), not this __main__

    text = README.read_text()
    if BEGIN not in text:
        sys.exit(f"{README} has no table of differences (the line {BEGIN.strip()!r}) to rewrite")
    README.write_text(text.replace(BEGIN + readme_table(text) + END, BEGIN + registry.table() + END))
    print(f"{README}: {len(registry.DIFFERENCES)} differences")
