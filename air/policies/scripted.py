"""A scripted policy: fixed replies per task, for demos, benchmarks and tests (it is not a model).

Each bundled task with a script has a short research story: look around, validate the baseline, make it worse
once (a regression), improve it, make mistakes an LLM makes (a reply without a command block, a command that
outlives its timeout), and submit. `expected_scores` holds what the task's real evaluation gives each
validation of the story (deterministic evaluations), so tests can compute the rewards by hand.
Tasks without a script get a generic one: inspect, validate the baseline, submit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from air.policies import Message


def _bash(command: str, thought: str = "") -> str:
    return f"{thought}\n\n```bash\n{command}\n```" if thought else f"```bash\n{command}\n```"


VALIDATE = "Let me score the current solution.\n\n```\nvalidate\n```"
SUBMIT = "I am done.\n\n```\nsubmit\n```"


def _write(path: str, content: str) -> str:
    return f"cat > {path} <<'EOF'\n{content}EOF"


@dataclass(frozen=True)
class Script:
    replies: tuple[str, ...]
    expected_scores: tuple[float | None, ...] = ()
    """Primary-metric score of each validation/submission in order (None = a failed validation)."""


SCRIPTS: dict[str, Script] = {
    "prisoners-dilemma": Script(
        replies=(
            _bash("ls -la && cat strategy.py", "First, the files."),
            VALIDATE,
            _bash(_write("strategy.py", "def row_strategy(history):\n    return 1\n"), "Try always defecting."),
            VALIDATE,
            "Defecting is worse; tit-for-tat should do better against reactive opponents.",  # no command block
            _bash(_write("strategy.py", "def row_strategy(history):\n    return history[-1][1] if history else 0\n")),
            VALIDATE,
            _bash(_write("strategy.py", "def row_strategy(history):\n    if len(history) >= 49:\n        return 1\n"
                         "    return history[-1][1] if history else 0\n"), "Defect in the last round."),
            SUBMIT,
        ),
        expected_scores=(2.61222, 2.0704, 2.674, 2.70266),
    ),
    "regression-rmse": Script(
        replies=(
            _bash("ls -la data/ && head -3 data/train.csv && cat train.py"),
            _bash("python train.py", "Run the baseline."),
            VALIDATE,
            _bash("sed -i 's/if c not in (\"id\", \"price\")/if c in (\"sqft\",)/' train.py && python train.py; "
                  "head -3 submission.csv", "Try a single feature."),
            VALIDATE,
            _bash("sleep 600", "Let me wait for a while."),  # outlives its timeout
            _bash("sed -i 's/if c in (\"sqft\",)/if c not in (\"id\", \"price\")/; "
                  "s/from sklearn.linear_model import LinearRegression/from sklearn.ensemble import "
                  "HistGradientBoostingRegressor/; s/LinearRegression()/HistGradientBoostingRegressor("
                  "random_state=0)/' train.py && python train.py", "Gradient boosting on the numeric columns."),
            VALIDATE,
            SUBMIT,
        ),
        expected_scores=(129.91891306180946, 161.4328886327752, 86.8185831488935, 86.8185831488935),
    ),
    "tabular-classification": Script(
        replies=(
            _bash("ls -la data/ && head -3 data/train.csv"),
            _bash("python train.py && head -3 submission.csv"),
            VALIDATE,
            _bash("sed -i 's/from sklearn.linear_model import LogisticRegression/from sklearn.ensemble import "
                  "HistGradientBoostingClassifier/; s/LogisticRegression(max_iter=1000)/"
                  "HistGradientBoostingClassifier(random_state=0)/' train.py && python train.py",
                  "Gradient boosting should capture the nonlinear structure."),
            VALIDATE,
            SUBMIT,
        ),
        expected_scores=(0.7365, 0.815, 0.815),
    ),
}

GENERIC = Script(replies=(_bash("ls -la"), VALIDATE, SUBMIT))
# For overhead benchmarks: many turns of a trivial command, then submit.
TRIVIAL = Script(replies=(*([_bash("true")] * 40), SUBMIT))

_TASK_ID = re.compile(r"\(id: ([^)\s]+)\)")


class ScriptedPolicy:
    """Replies from the script of the task named in the system prompt; the turn is the number of replies so far."""

    def __init__(self, scripts: dict[str, Script] | None = None, only: Script | None = None):
        self.scripts = SCRIPTS if scripts is None else scripts
        self.only = only

    def script_for(self, messages: list[Message]) -> Script:
        if self.only is not None:
            return self.only
        text = " ".join(m.get("content") or "" for m in messages[:2] if isinstance(m.get("content"), str))
        match = _TASK_ID.search(text)
        return self.scripts.get(match.group(1), GENERIC) if match else GENERIC

    def reply_for(self, messages: list[Message]) -> str:
        replies = self.script_for(messages).replies
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return replies[turn] if turn < len(replies) else SUBMIT

    async def reply(self, messages: list[Message]) -> str:
        return self.reply_for(messages)
