"""Each default is declared once: `air serve`'s options take theirs from the services' config models, and
task.toml's schema is TaskSpec's fields. These tests fail if a copy creeps back in and drifts."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from air import paths
from air.cli.serve import _commands, config_of, help_of, serve_app
from air.errors import TaskError
from air.services.agentgym import AgentGymConfig
from air.services.openenv import OpenEnvConfig
from air.services.sandbox_fusion import SandboxFusionConfig
from air.tasks.air_format.loader import _FOUND, _TaskToml, load_air_task
from air.tasks.spec import TaskSpec

CLI_ONLY = {"log_level", "as_json"}
"""Options of the command, not of the service: they have no field."""

FLAGS = {
    "sandbox-fusion": ["--port", "--host", "--image", "--concurrency", "--pool-size", "--cpus", "--memory-mb",
                       "--memory-limit-mode",
                       "--max-run-timeout", "--output-limit", "--queue-timeout", "--warm-python",
                       "--log-level", "--json"],
    "agentgym": ["--port", "--host", "--task", "--mlgym-root", "--harbor-root", "--allow-failed-oracle",
                 "--allow-hackable", "--examples-per-task", "--snapshot", "--max-turns",
                 "--max-seconds", "--command-timeout", "--observation-chars", "--reward-mode",
                 "--format-error-penalty", "--reward-report", "--max-envs",
                 "--max-envs-per-client", "--max-sandboxes", "--warm", "--idle-timeout", "--max-body-bytes",
                 "--token", "--trajectory-dir", "--log-level", "--json"],
    "openenv": ["--port", "--host", "--task", "--mlgym-root", "--harbor-root", "--allow-failed-oracle",
                "--allow-hackable", "--examples-per-task", "--snapshot", "--max-turns",
                "--max-seconds", "--max-format-errors", "--command-timeout", "--observation-chars", "--reward-mode",
                "--format-error-penalty", "--action-format",
                "--max-envs", "--max-envs-per-client", "--max-sandboxes", "--warm", "--idle-timeout",
                "--max-body-bytes", "--token", "--trajectory-dir", "--log-level", "--json"],
}
"""The flags as released: scripts and configs use them, so deriving them must not rename one."""

MODELS = {"sandbox-fusion": SandboxFusionConfig, "agentgym": AgentGymConfig, "openenv": OpenEnvConfig}


@pytest.mark.parametrize("command", list(MODELS))
def test_serve_options_are_the_config_fields(command):
    model, params = MODELS[command], [p for p in _commands()[command].params if p.name != "help"]
    assert [flag for p in params for flag in p.opts] == FLAGS[command]
    for param in params:
        if param.name in CLI_ONLY:
            continue
        assert param.name in model.model_fields, f"--{param.name} fills no field of {model.__name__}"
        field = model.model_fields[param.name]
        assert param.default == field.get_default(call_default_factory=True), param.name
        assert param.help and param.help.startswith(help_of(model, param.name)), param.name
    # What the command builds when given no flag is the model's default configuration.
    assert config_of(model, {p.name: p.default for p in params}) == model()


@pytest.mark.parametrize("command", list(MODELS))
def test_serve_help_shows_every_option_with_help_and_default(command):
    result = CliRunner().invoke(serve_app, [command, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    def flat(text: str) -> str:  # as one line, and a word the help wrapped at its hyphen whole again
        return " ".join(text.split()).replace("- ", "-")

    text = flat(result.output)
    for param in _commands()[command].params:
        assert param.help and flat(param.help) in text, param.name
        if param.default not in (None, [], False):
            shown = param.opts[0].lstrip("-") if getattr(param, "secondary_opts", None) else param.default  # on/off
            assert flat(f"[default: {shown}]") in text, param.name


def test_task_toml_is_task_spec_less_what_the_loader_finds():
    toml_fields, spec_fields = _TaskToml.model_fields, TaskSpec.model_fields
    assert set(toml_fields) == set(spec_fields) - set(_FOUND)
    for name, field in toml_fields.items():
        assert field.default == spec_fields[name].default, name
        assert field.metadata == spec_fields[name].metadata, name  # constraints such as reward_scale > 0


def _task_dir(tmp_path, edit):
    folder = tmp_path / "regression-rmse"
    shutil.copytree(paths.tasks_dir() / "regression-rmse", folder)
    toml = folder / "task.toml"
    toml.write_text(edit(toml.read_text()))
    return folder


def test_task_toml_values_and_errors(tmp_path):
    spec = load_air_task(_task_dir(tmp_path / "a", lambda text: text))
    assert spec.version == "1" and spec.source == "air" and spec.reward_scale is None
    assert not spec.description.startswith("\n") and spec.evaluation_files
    with pytest.raises(TaskError, match=r"field 'reward_scale': Input should be greater than 0"):
        load_air_task(_task_dir(tmp_path / "b", lambda text: "reward_scale = -1\n" + text))
    with pytest.raises(TaskError, match=r"field 'source': Extra inputs are not permitted in air's task.toml"):
        load_air_task(_task_dir(tmp_path / "c", lambda text: 'source = "elsewhere"\n' + text))


def test_the_taskset_keeps_room_for_the_scorer():
    """PoolConfig allows one sandbox; the taskset needs two (a validate leases the scorer's beside the agent's),
    where one would make every validate wait out lease_timeout and fail."""
    from pydantic import ValidationError

    from air_mlgym.taskset import AirTasksetConfig

    assert AirTasksetConfig(max_sandboxes=2).pool_config().max_sandboxes == 2
    with pytest.raises(ValidationError, match="at least 2"):
        AirTasksetConfig(max_sandboxes=1)


def test_the_episode_defaults_live_once():
    """The verifiers taskset and both episode servers take the episode's options from EpisodeSettings, whose
    defaults are EpisodeConfig's and RewardConfig's own: no copy to drift."""
    from air.episode.config import EpisodeConfig
    from air.episode.settings import EpisodeSettings
    from air_mlgym.taskset import AirTasksetConfig

    for model in (AirTasksetConfig, AgentGymConfig, OpenEnvConfig):
        assert issubclass(model, EpisodeSettings)
        assert model().episode_config() == EpisodeConfig(), model.__name__
