"""The bundled tasks' evaluators against broken and hostile submissions, through air's real scoring path: the agent
writes its submission in its sandbox, `validate` scores it in a scoring sandbox. Every case is refused as the
submission's result with a message that says why (never an infrastructure failure, never a score), and nothing the
code under evaluation printed while it saw hidden data reaches the message. (This replaces tasks/_lib's host-side
scripts, which had drifted from how air scores.)"""

from __future__ import annotations

import pytest

from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

pytestmark = pytest.mark.docker


def csv_from_test(column: str, value: str, ident: str = "id") -> str:
    """A submission with `value` for every row of the public test split, written as the agent would."""
    return (f"python -c \"import pandas as pd; t = pd.read_csv('data/test.csv'); "
            f"pd.DataFrame({{'{ident}': t['{ident}'], '{column}': '{value}'}}).to_csv('submission.csv', index=False)\"")


def write(path: str, text: str) -> str:
    return f"mkdir -p \"$(dirname {path})\" && cat > {path} <<'AIR_EOF'\n{text}\nAIR_EOF"


LEAK = "def _leak(h):\n    raise ValueError('LEAK:' + repr(h))\n"
CASES = {  # task: [(case, the agent's command, status, words the message must hold)]
    "prisoners-dilemma": [
        ("no strategy file", "rm strategy.py", "no_submission", "strategy.py"),
        ("a link to elsewhere", "rm strategy.py && ln -s /etc/passwd strategy.py", "invalid_submission", "link"),
        ("a bad return value", write("strategy.py", "def row_strategy(h):\n    return 'x'"), "invalid_submission",
         "must return"),
        ("NaN", write("strategy.py", "def row_strategy(h):\n    return float('nan')"), "invalid_submission",
         "must return"),
        ("an exception on hidden moves", write("strategy.py", LEAK + "def row_strategy(h):\n    return _leak(h)"),
         "invalid_submission", "ValueError"),
        ("no function", write("strategy.py", "def other(h):\n    return 0"), "invalid_submission", "row_strategy"),
        ("a syntax error", write("strategy.py", "def row_strategy(h)\n    return 0"), "invalid_submission",
         "SyntaxError"),
        ("the process exits", write("strategy.py", "import os\ndef row_strategy(h):\n    os._exit(0)"),
         "invalid_submission", "died"),
        ("a reply that is not JSON", write("strategy.py", "def row_strategy(h):\n    return object()"),
         "invalid_submission", "serialis"),
    ],
    "tabular-classification": [
        ("wrong columns", "printf 'id,pred\\n1,0\\n' > submission.csv", "invalid_submission", "columns"),
        ("missing rows", "printf 'id,label\\n100000,1\\n' > submission.csv", "invalid_submission", "missing"),
        ("empty", ": > submission.csv", "invalid_submission", "empty"),
        ("NaN labels", csv_from_test("label", "nan"), "invalid_submission", "NaN"),
        ("label 2", csv_from_test("label", "2"), "invalid_submission", "0 or 1"),
        ("a directory", "mkdir -p submission.csv", "invalid_submission", "regular file"),
    ],
    "regression-rmse": [
        ("infinite prices", csv_from_test("price", "inf"), "invalid_submission", "finite"),
        ("text prices", csv_from_test("price", "abc"), "invalid_submission", "finite"),
    ],
    "cartpole-policy": [
        ("a string action", write("policy/__init__.py", "def act(o):\n    return 'left'"), "invalid_submission",
         "must return"),
    ],
    "char-language-model": [
        ("the wrong shape", write("model/__init__.py", "def predict(c):\n    return [[1.0]] * len(c)"),
         "invalid_submission", "shape"),
        ("rows that do not sum to 1", write("model/__init__.py", "def predict(c):\n    return [[0.5] * 42 for _ in c]"),
         "invalid_submission", "sum to 1"),
        ("hidden text in an exception's name", write("model/__init__.py", "def predict(c):\n    if any(len(x) > 3 "
         "for x in c):\n        raise type('Leak_' + ''.join(ch for ch in c[0] if ch.isalpha()), (Exception,), {})()"
         "\n    return [[1 / 42] * 42 for _ in c]"), "invalid_submission", "an exception"),
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("task_id", list(CASES))
async def test_a_broken_or_hostile_submission_is_refused_with_its_reason(pool, task_id):
    env = TaskEnvironment(load_task(task_id), pool)
    problems = []
    for case, command, status, words in CASES[task_id]:
        async with env.lease() as sandbox:
            r = await sandbox.session.run(command, timeout=120)
            assert r.exit_code == 0, (case, r.stderr)
            outcome = await env.evaluate(sandbox)
        if outcome.status != status or words.lower() not in outcome.message.lower() or "LEAK" in outcome.message:
            problems.append((case, outcome.status, outcome.message[:300]))
    assert not problems, problems
