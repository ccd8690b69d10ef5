"""AgentGym's wire: the request bodies (AgentGym's field names), the step answer, and the client families whose
shapes differ (read at WooooDyy/AgentGym 3ef9235, agentenv/agentenv/envs/*.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from air.episode.parse import as_block


class CreateQuery(BaseModel):
    """`/create` body of searchqa and the tool envs (`{"id": 0}`); webshop, sqlgym and webarena send none."""

    id: int | None = None


INDEX_FIELDS = ("data_idx", "item_id", "id", "session_id", "idx")


class ResetQuery(BaseModel):
    """`/reset` body: the env and the task item, under whichever name the client's family uses for it."""

    env_idx: int
    data_idx: int | None = None
    item_id: int | None = None
    id: int | None = None
    session_id: int | None = None
    idx: int | None = None
    seed: int | None = None
    """webarena's client sends one; air's tasks are deterministic, so it is only recorded."""

    def index(self) -> dict[str, int]:
        """The item index under each name it was given."""
        return {name: getattr(self, name) for name in INDEX_FIELDS if getattr(self, name) is not None}


class StepQuery(BaseModel):
    env_idx: int
    action: str


class CloseQuery(BaseModel):
    env_idx: int


class StepResponse(BaseModel):
    observation: str
    """The field of the searchqa, tool and webarena clients."""
    state: str
    """The same text: webshop's and sqlgym's clients read `state`."""
    reward: float
    done: bool
    terminated: bool
    """`done` again: webarena's client reads `terminated` (and pays `reward` only then)."""
    info: dict[str, Any]


FamilyName = Literal["", "webshop", "sqlgym", "webarena"]


@dataclass(frozen=True)
class Family:
    """Where one family of AgentGym's clients differs from the common wire (served under `/<name>`; the root
    serves the searchqa and tool clients, AgentGym-RL's use of them, and any client written to the wire)."""

    name: FamilyName
    client: str
    create_wraps: bool = False
    """webarena's client reads `create`'s answer as `{"env_idx": N}`; the others take a bare integer."""
    reset_shape: Literal["text", "pair", "object"] = "text"
    """What `reset` answers: the observation (searchqa, tool), `[observation, null]` (webshop's client replaces
    item 0 by GET /observation), `{"observation": ...}` (webarena's client reads that key)."""
    sends_command_only: bool = False
    """sqlgym's client sends only the contents of the reply's last ```sql block: air wraps it back in a block."""
    note: str | None = None
    """Said to the model after the first observation: how to reply so that this client's own parsing keeps the
    command."""

    def created(self, env_idx: int) -> Any:
        return {"env_idx": env_idx} if self.create_wraps else env_idx

    def reset_answer(self, observation: str, info: dict[str, Any]) -> Any:
        if self.reset_shape == "pair":
            return [observation, None]
        if self.reset_shape == "object":
            return {"observation": observation, "info": info}
        return observation

    def reply(self, action: str) -> str:
        """What air's parser gets: the reply as sent, or the command sqlgym's client extracted, in a block."""
        return as_block(action) if self.sends_command_only else action

    def first_observation(self, prompt: str) -> str:
        return f"{prompt}\n\n{self.note}" if self.note else prompt


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("", "SearchQAEnvClient, TodoEnvClient and the other tool-env clients"),
    Family("webshop", "WebshopEnvClient", reset_shape="pair",
           note="Your client sends only what follows the last `Action:` in your reply: end every reply with "
                "`Action:` and then your code block."),
    Family("sqlgym", "SqlGymEnvClient", sends_command_only=True,
           note="Your client sends only the contents of your reply's last ```sql block: write your shell command "
                "(or validate, or submit) inside a block opened with ```sql."),
    Family("webarena", "WebarenaEnvClient", create_wraps=True, reset_shape="object"),
)}
