"""A scripted policy: fixed replies per task, for demos, benchmarks and tests (it is not a model).

Each bundled task with a script has a short research story: look around, validate the baseline, make it worse
once (a regression), improve it, make mistakes an LLM makes (a reply without a command block, a command that
outlives its timeout), and submit. `expected_scores` holds what the task's real evaluation gives each
validation of the story (deterministic evaluations), so tests can compute the rewards by hand.
Tasks without a script get a generic one: inspect, validate the baseline, submit.

A story is told in either action format (air/actions.py): each turn is a thought and at most one action, written
as a fenced block in the text format and as one tool call in the tools format (a turn without an action is the
reply that forgets to act, a format error in both). So the same story earns the same rewards in both formats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from air.actions import BASH, TOOLS, Reply, ToolCall
from air.actions import SUBMIT as SUBMIT_TOOL
from air.actions import VALIDATE as VALIDATE_TOOL
from air.policies import Message


@dataclass(frozen=True)
class Turn:
    """One scripted reply: what the agent says, and the tool it uses (None: it forgets to act)."""

    thought: str = ""
    tool: str | None = None
    command: str = ""
    """The shell command of a `bash` turn."""

    def text(self) -> str:
        """The reply in the text format: the thought, then one fenced block."""
        if self.tool is None:
            return self.thought
        block = f"```bash\n{self.command}\n```" if self.tool == BASH.name else f"```\n{self.tool}\n```"
        return f"{self.thought}\n\n{block}" if self.thought else block

    def call(self, number: int, offered: list[dict[str, Any]] | None = None) -> Reply:
        """The reply in the tools format: the thought as its text, the action as its one call (id `call_<number>`,
        the name as `offered` spells it: a harness may prefix air's tool names)."""
        if self.tool is None:
            return Reply(content=self.thought or None)
        arguments = {"command": self.command} if self.tool == BASH.name else {}
        return Reply(content=self.thought or None,
                     tool_calls=(ToolCall.of(_offered_name(self.tool, offered), arguments, id=f"call_{number}"),))


def _offered_name(tool: str, offered: list[dict[str, Any]] | None) -> str:
    """The name air's `tool` is offered by: the offered tool with air's description (a harness may offer a tool
    of its own by the same name), else air's own name."""
    description = next(t.description for t in TOOLS if t.name == tool)
    functions = [t.get("function") for t in offered or () if isinstance(t, dict)]
    return next((f["name"] for f in functions if isinstance(f, dict) and f.get("description") == description
                 and isinstance(f.get("name"), str)), tool)


def _bash(command: str, thought: str = "") -> Turn:
    return Turn(thought, BASH.name, command)


VALIDATE_TURN = Turn("Let me score the current solution.", VALIDATE_TOOL.name)
SUBMIT_TURN = Turn("I am done.", SUBMIT_TOOL.name)
VALIDATE = VALIDATE_TURN.text()
SUBMIT = SUBMIT_TURN.text()
"""The validate and submit replies in the text format."""


def _write(path: str, content: str) -> str:
    return f"cat > {path} <<'EOF'\n{content}EOF"


@dataclass(frozen=True)
class Script:
    turns: tuple[Turn, ...]
    expected_scores: tuple[float | None, ...] = ()
    """Primary-metric score of each validation/submission in order (None = a failed validation)."""

    @property
    def replies(self) -> tuple[str, ...]:
        """The story in the text format."""
        return tuple(turn.text() for turn in self.turns)


SCRIPTS: dict[str, Script] = {
    "prisoners-dilemma": Script(
        turns=(
            _bash("ls -la && cat strategy.py", "First, the files."),
            VALIDATE_TURN,
            _bash(_write("strategy.py", "def row_strategy(history):\n    return 1\n"), "Try always defecting."),
            VALIDATE_TURN,
            Turn("Defecting is worse; tit-for-tat should do better against reactive opponents."),  # no action
            _bash(_write("strategy.py", "def row_strategy(history):\n    return history[-1][1] if history else 0\n")),
            VALIDATE_TURN,
            _bash(_write("strategy.py", "def row_strategy(history):\n    if len(history) >= 49:\n        return 1\n"
                         "    return history[-1][1] if history else 0\n"), "Defect in the last round."),
            SUBMIT_TURN,
        ),
        expected_scores=(2.61222, 2.0704, 2.674, 2.70266),
    ),
    "regression-rmse": Script(
        turns=(
            _bash("ls -la data/ && head -3 data/train.csv && cat train.py"),
            _bash("python train.py", "Run the baseline."),
            VALIDATE_TURN,
            _bash("sed -i 's/if c not in (\"id\", \"price\")/if c in (\"sqft\",)/' train.py && python train.py; "
                  "head -3 submission.csv", "Try a single feature."),
            VALIDATE_TURN,
            _bash("sleep 600", "Let me wait for a while."),  # outlives its timeout
            _bash("sed -i 's/if c in (\"sqft\",)/if c not in (\"id\", \"price\")/; "
                  "s/from sklearn.linear_model import LinearRegression/from sklearn.ensemble import "
                  "HistGradientBoostingRegressor/; s/LinearRegression()/HistGradientBoostingRegressor("
                  "random_state=0)/' train.py && python train.py", "Gradient boosting on the numeric columns."),
            VALIDATE_TURN,
            SUBMIT_TURN,
        ),
        expected_scores=(129.91891306180946, 161.4328886327752, 86.8185831488935, 86.8185831488935),
    ),
    "tabular-classification": Script(
        turns=(
            _bash("ls -la data/ && head -3 data/train.csv"),
            _bash("python train.py && head -3 submission.csv"),
            VALIDATE_TURN,
            _bash("sed -i 's/from sklearn.linear_model import LogisticRegression/from sklearn.ensemble import "
                  "HistGradientBoostingClassifier/; s/LogisticRegression(max_iter=1000)/"
                  "HistGradientBoostingClassifier(random_state=0)/' train.py && python train.py",
                  "Gradient boosting should capture the nonlinear structure."),
            VALIDATE_TURN,
            SUBMIT_TURN,
        ),
        expected_scores=(0.7365, 0.815, 0.815),
    ),
    # GPU results are not bit-exact (cuDNN picks its kernels per run): no expected scores. Measured on one H200: the
    # baseline 0.43, the improvement 0.91 (12 s of training).
    "gpu-cnn-speedrun": Script(
        turns=(
            _bash("ls -la . data/ && sed -n 1,10p data/shapes.py && python -c \"import torch; "
                  "print('cuda', torch.cuda.is_available())\"", "First, the files and the GPU."),
            _bash("python train.py", "Run the baseline."),
            VALIDATE_TURN,
            _bash("sed -i 's/opt = torch.optim.SGD(net.parameters(), lr=args.lr)/opt = torch.optim.AdamW("
                  "net.parameters(), lr=args.lr, weight_decay=5e-4); sched = torch.optim.lr_scheduler.OneCycleLR("
                  "opt, args.lr, total_steps=args.steps)/; s/        opt.step()$/        opt.step(); sched.step()/' "
                  "train.py && python train.py --steps 2000 --lr 0.003 --width 64 --depth 3 --batch 256",
                  "Plain SGD learns slowly: AdamW with a one-cycle schedule, a wider and deeper net, larger batches."),
            VALIDATE_TURN,
            SUBMIT_TURN,
        ),
    ),
}

GENERIC = Script(turns=(_bash("ls -la"), VALIDATE_TURN, SUBMIT_TURN))
# For overhead benchmarks: many turns of a trivial command, then submit.
TRIVIAL = Script(turns=(*([_bash("true")] * 40), SUBMIT_TURN))

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

    def turn_for(self, messages: list[Message]) -> tuple[int, Turn]:
        """(the number of replies so far, the next reply's turn of the story: submit once it is told)."""
        turns = self.script_for(messages).turns
        n = sum(1 for m in messages if m.get("role") == "assistant")
        return n, turns[n] if n < len(turns) else SUBMIT_TURN

    def reply_for(self, messages: list[Message]) -> str:
        return self.turn_for(messages)[1].text()

    def tool_reply_for(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> Reply:
        n, turn = self.turn_for(messages)
        return turn.call(n + 1, tools)

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str | Reply:
        return self.tool_reply_for(messages, tools) if tools else self.reply_for(messages)
