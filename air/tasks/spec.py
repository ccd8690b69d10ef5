"""One typed description of a research task, whatever format it was written in.

A task is files plus rules: what the agent starts with (starter files, read-only data), what only the scorer
sees (secret files, evaluation code), what the agent must produce (submission artefacts), how it is scored
(evaluation entry and contract, metrics with a direction and one primary), what the baseline scores, and the
time and resource limits. Loaders (air's task.toml, MLGym's YAMLs) build this; nothing downstream cares which.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from air.actions import ActionFormat
from air.sandbox.spec import Condition, ServiceSpec

Direction = Literal["higher", "lower"]
Contract = Literal["air", "mlgym-csv", "mlgym-model", "mlgym-lm", "mlgym-python", "harbor"]


_LATER_FIELDS = {"action_format": "text", "build": None, "image_workspace": None, "env": {}, "verifier_image": None,
                 "verifier_build": None, "verifier_installs": False,
                 "verifier_collect": [], "verifier_artifacts": None, "services": [], "service_builds": {},
                 "service_waits": {}, "service_collect": [], "service_artifacts": [], "reward_anchor": None}
"""TaskSpec's fields that joined after task hashes were recorded (trajectories, host baselines), with defaults."""


class FileEntry(BaseModel):
    """A file or directory on the host (`source`) and where it lands (`dest`, relative)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Path
    dest: str

    @field_validator("dest")
    @classmethod
    def _relative(cls, dest: str) -> str:
        return _inside(dest, "destination")


def _inside(path: str, what: str) -> str:
    """`path` as a relative path that stays inside its root; ValueError (the task does not load) otherwise."""
    p = PurePosixPath(path)
    if not path.strip() or p.is_absolute() or ".." in p.parts:
        raise ValueError(f"{what} {path!r} must be relative and stay inside its root")
    return str(p)


class Metric(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    direction: Direction
    primary: bool = False
    best: float | None = None
    """The best value the metric can take (accuracy 1, rmse 0), when it has one: a reference or baseline submission
    that reaches it is flagged as a leaked answer key (air.tasks.leaks)."""


class Evaluation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    contract: Contract = "air"
    """air: `evaluate.py` writes $AIR_METRICS_FILE; mlgym-*: MLGym's four scoring contracts (stdout JSON); harbor:
    Harbor's `tests/test.sh` writes /logs/verifier/reward.txt or reward.json (air.tasks.harbor)."""
    entry: str = "evaluate.py"
    submission: list[str] = []
    """Artefacts copied out of the workspace for scoring (relative paths inside it; files or directories)."""
    timeout: float = Field(300, gt=0, strict=True)  # strict: `true` is no number of seconds
    max_submission_mb: int = Field(512, gt=0)
    submission_flag: str | None = Field(None, pattern=r"^--[A-Za-z][A-Za-z0-9_-]*$")
    """mlgym-csv: the option that names the submission to the evaluation; None is MLGym's `--submission_file`
    (AIRS-Bench's evaluate.py declares `--submission-file`, and argparse takes no other spelling)."""
    metrics_output: Literal["last-json"] | None = None
    """mlgym-csv: None is MLGym's reading (stdout is one JSON object); last-json: the evaluation prints its progress
    and then its metrics as the last JSON object of its output (AIRS-Bench's `json.dumps(result, indent=2)`)."""
    agent_module: str | None = None
    """MLGym tasks whose evaluation imports the agent's code (e.g. `strategy`): the evaluator runs as root and that
    module becomes a proxy to the agent's code in an unprivileged process (air_eval_kit.UntrustedModule)."""
    agent_functions: list[str] = []
    trusted: bool = True
    """False: the evaluation runs the agent's code in its own process (MLGym's trust model, an undeclared MLGym
    task): it runs as the agent, and its score is only as good as that."""
    env: dict[str, str] = {}
    """Variables of the evaluation's process (Harbor's [verifier].env), `${VAR}` and `${VAR:-default}` taken from
    the host's environment when it runs, never stored resolved."""

    @field_validator("submission")
    @classmethod
    def _in_the_workspace(cls, paths: list[str]) -> list[str]:
        return [_inside(path, "submission path") for path in paths]


class Baseline(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # rewards normalise by it

    command: str = ""
    """Run by the agent user in the staged workspace to produce the baseline submission ("" = the starter is)."""
    scores: dict[str, float] = {}
    tolerance: float = Field(0.0, ge=0)
    """Allowed |score - recorded| of a deterministic evaluation (and the least allowed of a stochastic one)."""
    stochastic: bool = False
    """The evaluation is random (unseeded simulations, timings): `air tasks check` compares the recorded score
    with a bound from repeated evaluations, never exactly. Found out too when two evaluations of one submission
    differ; declaring it guards against two draws that happen to agree."""
    reproducible: bool = True
    """False: the task ships nothing that produces its baseline (MLGym's titanic): its scores are a record that
    cannot be reproduced, and the check only exercises the evaluation on `baseline_files` (a reference
    submission) when the task has one."""


class RewardAnchor(BaseModel):
    """A task with no baseline of its own, scored against its suite's state of the art (AIRS-Bench's
    metadata.yaml): rewards are the suite's normalised score (air.episode.rewards), 0 at the suite's worst score and
    1 at the state of the art, on a log scale of the distance to the metric's optimum."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    sota: float
    """The state of the art (the published score the suite records)."""
    worst: float
    """The suite's estimated worst score: normalised 0."""
    optimal: float
    """The metric's best possible value (accuracy 1, an error 0)."""
    source: str = ""
    """Where the numbers are from (the metadata file, the paper)."""

    @model_validator(mode="after")
    def _apart(self) -> RewardAnchor:
        if len({self.sota, self.worst, self.optimal}) != 3:
            raise ValueError(f"the state of the art ({self.sota:g}), the worst score ({self.worst:g}) and the "
                             f"optimum ({self.optimal:g}) must differ, or no score lies between them")
        if abs(self.sota - self.optimal) >= abs(self.worst - self.optimal):
            raise ValueError(f"the state of the art ({self.sota:g}) must be nearer the optimum ({self.optimal:g}) "
                             f"than the worst score ({self.worst:g})")
        return self


class ServiceCollect(BaseModel):
    """A [[verifier.collect]] command Harbor runs in one of the task's services (`service = "db"`): air runs it
    there too, in the rollout's own service container (air.tasks.harbor.collect.from_services)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str
    command: str
    timeout: float = Field(60, gt=0)
    user: str | None = None


class ServiceArtifact(BaseModel):
    """A file or folder of a service (Harbor's artifact with `service`, its `source` absolute there) that the
    verifier finds at /logs/artifacts/`destination`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str
    source: str = Field(pattern=r"^/")
    destination: str


class Collect(BaseModel):
    """A command that gathers what the agent left into /logs/artifacts before the tests (Harbor's
    [[verifier.collect]]): air.tasks.harbor.collect runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str
    timeout: float = Field(300, gt=0)


class Timeouts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # strict: a TOML or YAML `true` would otherwise be a timeout of 1 s
    command: float = Field(60, gt=0, strict=True)
    training: float = Field(1800, gt=0, strict=True)
    episode: float | None = Field(None, gt=0, strict=True)
    """The task's own wall-clock budget for an episode (Harbor's [agent].timeout_sec): an episode ends at the
    sooner of it and the run's max_seconds."""


MAX_MEMORY_MB = 4 << 20
"""4 TiB: more than any host air runs on. A task asking more has a typo in it (99999999999), and Docker would take
it as no limit at all."""


class TaskResources(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(2048, ge=128, le=MAX_MEMORY_MB)
    gpus: int = Field(0, ge=0)
    workspace_mb: int | None = Field(None, ge=16)
    """The home's quota (Harbor's [environment].storage_mb); None: the sandbox's default (SandboxSpec)."""


class TrainingNeeds(BaseModel):
    """What producing the baseline takes: the task's own training budget and air's measured estimate of its time
    on a CPU. `air tasks check` weighs the estimate against its budget before it runs the baseline."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    declared: str
    """The task's own budget in its words, e.g. "5 checkpoints x 10,000,000 steps (src/config.yaml)"."""
    cpu_seconds: float = Field(gt=0)
    """Measured estimate of the baseline's training in air's sandbox on a CPU host (see air/tasks/stacks.py)."""
    basis: str = ""
    """How the estimate was made, e.g. "about 8,100 steps/s measured in air's sandbox on a 2-core CPU"."""
    gpu: bool = True
    """It is meant for a GPU host (where its record was made)."""


class TaskNeeds(BaseModel):
    """What a task needs from the host beyond a CPU image that `air images build` makes: shown by
    `air tasks list`, and checked when a sandbox is made for it (one-line errors naming the fix)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_evaluation: bool = False
    """Its evaluation cannot run without a GPU (MLGym's LM tasks score a model on CUDA): the scoring sandbox gets
    the task's GPUs, as the agent's sandbox does."""
    datasets: list[str] = []
    """Hugging Face dataset ids the task's code loads with `datasets.load_dataset`: served read-only from air's
    local data store (`air data add ID --from DIR`), since containers have no network."""
    missing_data: list[str] = []
    """A local dataset not on this host, one line each saying which and how to prepare it (an AIRS-Bench task's
    data_path names its authors' cluster): the task loads, and cannot run here until it is prepared."""
    notes: list[str] = []
    """What else it needs that air cannot provide offline (model weights, packages no recipe has)."""
    training: TrainingNeeds | None = None
    """A baseline that trains for long (MLGym's RL tasks): its declared budget and measured CPU time."""


class HiddenSplit(BaseModel):
    """Data a task draws per host from a secret seed, so that its public generator cannot reproduce it.

    The task's folder holds the public split and the reference draw (the generator's public seed: the record, which
    `air tasks check` reproduces exactly). Rollouts get this host's draw instead: `generate.py --hidden OUT` run by
    the harness with a seed derived from a host secret (air.tasks.hidden), which never enters an agent's sandbox.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    data: list[str] = []
    """Files of the draw the agent sees, under data/ (e.g. the test features)."""
    secret: list[str] = []
    """Files of the draw only the scorer sees, under secret/ (e.g. the test labels)."""
    generator: str = "generate.py"
    baseline_draws: list[float] = []
    """The baseline's primary score on independent draws (scripts/record_draws.py): how far this host's draw may
    move it. `air tasks check` holds a host's baseline to their prediction interval."""
    drawn: Literal["host", "evaluation"] = "host"
    """How often the hidden split is drawn: once per host, or afresh for every evaluation (issue #47), inside the
    scoring sandbox, with the baseline scored on the same draw (air.tasks.draws). Only a split the agent sees nothing
    of can be drawn per evaluation (no `data` files): a leak of one evaluation's draw is then worth nothing at the
    next."""
    draw: str = "reference"
    """Set by the loader: "reference", the id of this host's draw (a digest of its seed, never the seed), or
    "each evaluation" (a new draw every time)."""
    folder: Path | None = None
    """Set by the loader for a host draw: where air keeps it (made on first use, air.tasks.hidden.ensure_drawn)."""

    @model_validator(mode="after")
    def _drawn_per_evaluation_is_the_scorers_alone(self) -> HiddenSplit:
        if self.drawn == "evaluation" and self.data:
            raise ValueError(f"[hidden] drawn = \"evaluation\" needs a split the agent sees nothing of, but it "
                             f"draws data files ({', '.join(self.data)}) the agent predicts on: drawn = \"host\"")
        return self


class ImageBuild(BaseModel):
    """A task whose image is built from its own Dockerfile (a Harbor task's environment/), not from air's recipes:
    air's builder builds it offline and adds air's layer (air.images.dockerfile). `TaskSpec.image` is then the tag
    of that build, named after everything that goes into it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context: Path
    dockerfile: str | None = "Dockerfile"
    """Relative to `context`; None: the image is `base` as it is (Harbor's [environment].docker_image alone)."""
    base: str | None = None
    """A prebuilt image the task names instead of a Dockerfile."""
    workdir: str | None = None
    """Where the agent works, overriding the Dockerfile's WORKDIR (Harbor's [environment].workdir)."""
    timeout: float = Field(600, gt=0)
    args: dict[str, str | None] = {}
    """Build args (a compose service's `build.args`) as written: filled from the host's environment at the build
    (air.tasks.hostenv.build_args_filled), never stored filled; None: the host's variable of that name."""


class TaskSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    version: str = "1"
    description: str
    image: str = "cpu"
    source: str = "air"
    """Where it came from: "air" (tasks/<id>/task.toml) or "mlgym:<yaml path>"."""
    starter: list[FileEntry] = []
    """Into the agent's workspace, owned by the agent."""
    data: list[FileEntry] = []
    """Read-only data, visible to the agent as workspace/data and to the scorer."""
    secret: list[FileEntry] = []
    """Scorer only: never in the agent's sandbox."""
    evaluation_files: list[FileEntry] = []
    """Scorer only: the pristine evaluation code."""
    baseline_files: list[FileEntry] = []
    """Copied over the workspace to build the baseline (air tasks)."""
    evaluation: Evaluation
    baseline: Baseline = Baseline()
    metrics: list[Metric]
    timeouts: Timeouts = Timeouts()
    resources: TaskResources = TaskResources()
    needs: TaskNeeds = TaskNeeds()
    reward_scale: float | None = Field(None, gt=0)
    """Normalisation scale for rewards when |baseline| is a poor yardstick (see air.episode.rewards)."""
    reward_anchor: RewardAnchor | None = None
    """No baseline: rewards are the suite's normalised score against its state of the art (RewardAnchor)."""
    hidden: HiddenSplit | None = None
    action_format: ActionFormat = "text"
    """How the model acts on this task unless a run says otherwise (air/actions.py): text or tools."""
    leaks: list[str] = []
    """Answer keys within reach, found by the loader (air.tasks.leaks): each names the evaluation-only file and the
    file the agent (or anyone, for a sample submission) can read that equals it."""
    build: ImageBuild | None = None
    """How the task's own image is built (a Harbor task); None: `image` names one of air's recipes."""
    verifier_image: str | None = None
    """The image the evaluation runs in when it is not the agent's (a Harbor task's separate verifier, built from
    its tests/Dockerfile or named by [verifier.environment].docker_image); None: the task's `image`."""
    verifier_build: ImageBuild | None = None
    """How `verifier_image` is built (with air's layer, as `build`)."""
    verifier_collect: list[Collect] = []
    """Harbor's [[verifier.collect]] commands, run before the tests (air.tasks.harbor.collect)."""
    verifier_artifacts: list[str] | None = None
    """A separate verifier's view of the workspace (Harbor uploads only the declared artifacts): the workspace-relative
    paths of the copy kept over the verifier image's own working directory ("." the whole copy); None (shared mode):
    the whole copy."""
    verifier_installs: bool = False
    """`verifier_image` is `build.base` (the task's image) with what its test installs at verify time put in it
    (air.tasks.harbor.installs), so that the test runs unchanged offline."""
    image_workspace: str | None = None
    """A directory of the image whose files start the workspace (where air's image layer put a Harbor task's
    WORKDIR, which then links to the workspace): copied in when the sandbox is staged, owned by the agent."""
    services: list[ServiceSpec] = []
    """Services beside the agent's sandbox (a Harbor compose task's: sandbox/docker/services.py) on its private network;
    their environment's templates are filled when a sandbox is made, as `env`'s."""
    service_builds: dict[str, ImageBuild] = {}
    """Service images built from the task's folder ({tag: how}), as the task's own image is (no air layer)."""
    service_waits: dict[str, Condition] = {}
    """What a lease waits for of the services (compose's `main` depends_on)."""
    service_collect: list[ServiceCollect] = []
    """[[verifier.collect]] commands of a service, run in the rollout's service before each evaluation."""
    service_artifacts: list[ServiceArtifact] = []
    """What of the rollout's services the test finds under /logs/artifacts (copied out after service_collect)."""
    env: dict[str, str] = {}
    """Variables of the agent's shell and of the evaluation (Harbor's [environment].env and its Dockerfile's ENV);
    `${VAR}` and `${VAR:-default}` are taken from the host's environment when a sandbox is made."""

    @model_validator(mode="after")
    def _one_primary(self) -> TaskSpec:
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"metric names repeat: {names}")
        primaries = [m.name for m in self.metrics if m.primary]
        if len(primaries) != 1:
            raise ValueError(f"exactly one metric must be primary, found {primaries or 'none'}")
        return self

    def replace(self, **changes) -> TaskSpec:
        """A validated copy with fields changed (model_copy would carry the cached content hash along)."""
        return TaskSpec(**{**{name: getattr(self, name) for name in TaskSpec.model_fields}, **changes})

    def _later_defaults(self) -> dict:
        """The fields added after hashes were first recorded, where they hold their defaults."""
        later: dict = {name: True for name, default in _LATER_FIELDS.items() if getattr(self, name) == default}
        nested = {(part, name) for part, name in (("timeouts", "episode"), ("resources", "workspace_mb"),
                                                  ("evaluation", "env"), ("evaluation", "submission_flag"),
                                                  ("evaluation", "metrics_output"), ("needs", "missing_data"))
                  if getattr(getattr(self, part), name) in (None, {}, [])}
        for part, name in nested:
            later.setdefault(part, {})[name] = True
        return later

    @property
    def primary(self) -> Metric:
        return next(m for m in self.metrics if m.primary)

    @property
    def baseline_score(self) -> float | None:
        return self.baseline.scores.get(self.primary.name)

    @cached_property
    def content_hash(self) -> str:
        """Changes whenever the spec or any file it names changes: replays use it to detect drift. A host draw's
        files count by their draw id (in the spec), so the hash is the same before and after they are made."""
        # Fields that joined the spec later are left out at their defaults. Where the files are (a checkout's path,
        # the cache's) is left out too: their names and bytes count below, so two checkouts of one task, or a
        # recording replayed in another clone, hash the same.
        data = self.model_dump(mode="json", exclude=self._later_defaults())
        for key in ("starter", "data", "secret", "evaluation_files", "baseline_files"):
            for entry in data.get(key) or ():
                entry.pop("source", None)
        if data.get("hidden"):
            data["hidden"].pop("folder", None)
        h = hashlib.sha256(json.dumps(data, sort_keys=True).encode())
        drawn = self.hidden.folder if self.hidden else None
        for entry in (*self.starter, *self.data, *self.secret, *self.evaluation_files, *self.baseline_files):
            if drawn is not None and entry.source.is_relative_to(drawn):
                continue
            for path in sorted(entry.source.rglob("*")) if entry.source.is_dir() else [entry.source]:
                if path.is_file():
                    h.update(str(path.relative_to(entry.source.parent)).encode())
                    h.update(path.read_bytes())
        return h.hexdigest()[:16]
