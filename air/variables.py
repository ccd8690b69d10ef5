"""Every environment variable air reads, parsed in one place with its range (issue 49).

A variable is input like a flag: a bad value is one line naming it (a UsageError, exit 2), never a module import of
whatever it holds, a uid outside the agents' range, or a clock that never ticks. `value(name)` parses at each read
(a test or a service may change the environment); the CLI checks every set variable before any command runs
(`check_all`), so a typo is said at once, not when the first evaluation reads it. An empty value counts as unset
(a shell's `AIR_BACKEND= air run` means the default). docs/variables.md names each, its range and its default
(tests/test_variables.py keeps both in step, and finds any `os.environ` read of an AIR_ variable elsewhere).

Variables that name folders (AIR_CACHE_DIR, AIR_RUNTIME_DIR, ...) are parsed here as text; whether the folder can
be made is said where it is made, naming the variable (air.paths, air/sandbox/hostdir.py).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from air.errors import UsageError

AGENT_UID_BASE = 1_879_048_192
"""The default first agent uid (air.sandbox.layout re-exports it): far above any host user's."""
AGENT_UID_MAX = 2**31 - 2**21
"""The highest base: the agents' uids (base + a slot) stay below 2**31, which every runtime takes."""


class _Bad(ValueError):
    """Why a value is out of its range (said after the variable's name)."""


@dataclass(frozen=True)
class Variable:
    name: str
    parse: Callable[[str], Any]
    default: Any
    range: str
    """The values it takes, as docs/variables.md says them."""
    what: str
    default_text: str = ""
    secret: bool = False
    """A key or token: a bad value is refused without quoting it (an error line travels into logs and issues)."""

    def __post_init__(self) -> None:
        if not self.default_text:
            object.__setattr__(self, "default_text", "unset" if self.default is None else str(self.default))


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise _Bad(f"is not one of {', '.join(options)}")
        return text
    return parse


def _int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not re.fullmatch(r"\d{1,12}", text.strip()):
            raise _Bad(f"is not a whole number from {low} to {high}")
        number = int(text)
        if not low <= number <= high:
            raise _Bad(f"is out of range ({low} to {high})")
        return number
    return parse


def _float(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            number = float(text)
        except ValueError:
            raise _Bad(f"is not a number from {low:g} to {high:g}") from None
        if not math.isfinite(number) or not low <= number <= high:
            raise _Bad(f"is out of range ({low:g} to {high:g})")
        return number
    return parse


def _http_url(text: str) -> str:
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Bad("is not an http(s) URL (e.g. http://localhost:8000/v1)")
    return text.strip()


_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def dns_label(text: str) -> str:
    """A Kubernetes namespace (and any DNS-1123 label): lower-case letters, digits and '-', 1 to 63."""
    if not _LABEL.fullmatch(text):
        raise _Bad("is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter "
                   "or digit, 63 at most)")
    return text


def _cidrs(text: str) -> list[str]:
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            out.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise _Bad(f"holds {part!r}, which is not an address block (e.g. 10.1.2.3/32)") from None
    return out


def _run_id(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", text):
        raise _Bad("is not a run id (letters, digits, '.', '_' and '-', 63 at most, starting with a letter or digit)")
    return text


def _profile(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}", text):
        raise _Bad("is not an AppArmor profile name")
    return text


def _runtime(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}", text):
        raise _Bad("is not a Docker runtime's name")
    return text


def _text(text: str) -> str:
    return text


def _hex_key(text: str) -> bytes:
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        raise _Bad("is not hex (e.g. `openssl rand -hex 32`)") from None
    if len(key) < 16:
        raise _Bad("is shorter than 16 bytes (e.g. `openssl rand -hex 32`)")
    return key


def _path(text: str) -> str:
    if "\0" in text:
        raise _Bad("holds a NUL byte")
    return text


def _place(text: str) -> tuple[str, str]:
    """(the path, its nearest existing part) when the path is a folder or can be made one (that part is a folder);
    _Bad otherwise."""
    path = os.path.abspath(os.path.expanduser(_path(text)))
    probe = path
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise _Bad(f"is not a folder ({probe} is a file)" if probe == path else f"cannot be made ({probe} is not a "
                   "folder)")
    return path, probe


def _folder_to_read(text: str) -> str:
    """A folder air reads (and one command makes): a file there, or on its way, is refused; whether it can be
    written is said where it is written."""
    _place(text)
    return text


def _folder(text: str) -> str:
    """A folder air makes and writes: one that is, or whose nearest existing parent is, a folder air may write
    (checked without making anything; where it is made, a failure still names the variable)."""
    path, probe = _place(text)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise _Bad(f"cannot be written ({probe} is not writable)" if probe == path else
                   f"cannot be made ({probe} is not writable)")
    return text


def _patience(text: str) -> str | float:
    if text.strip() == "auto":
        return "auto"
    return _float(1.0, 100.0)(text)


def _table() -> dict[str, Variable]:
    rows = [
        Variable("AIR_BACKEND", _choice("docker", "kubernetes", "enroot"), "docker",
                 "`docker`, `kubernetes` or `enroot`",
                 "where sandboxes run (PoolConfig.backend's default; docs/kubernetes.md, docs/hpc.md)"),
        Variable("AIR_AGENT_UID_BASE", _int(1000, AGENT_UID_MAX), AGENT_UID_BASE, f"1000 to {AGENT_UID_MAX}",
                 "the first agent uid (each sandbox's agent: this plus its slot); under rootless Docker, e.g. 20000"),
        Variable("AIR_APPARMOR", _profile, None, "an AppArmor profile name",
                 "the sandboxes' AppArmor profile (unset: the daemon's default; `unconfined` gives cells)"),
        Variable("AIR_DOCKER_RUNTIME", _runtime, None, "a runtime the Docker daemon knows (e.g. `runsc`)",
                 "the Docker backend's OCI runtime for every sandbox (`runsc`: gVisor; docs/gvisor.md)",
                 default_text="the daemon's default (runc)"),
        Variable("AIR_GPU_ACCESS", _choice("auto", "runtime", "cdi", "devices"), "auto",
                 "`auto`, `runtime`, `cdi` or `devices`",
                 "how GPUs reach a sandbox: the NVIDIA runtime, CDI, or device nodes (auto: the first the host has; "
                 "docs/gpu.md)"),
        Variable("AIR_RESULT_CLOCK", _float(1.0, 10.0), 1.5, "1 to 10",
                 "the coarse clock's ratio for results of hidden-data evaluations; 1 turns it off (SECURITY.md)"),
        Variable("AIR_HIDDEN_DRAW", _choice("host", "reference"), "host", "`host` or `reference`",
                 "which draw of a task's hidden data is the default (docs/tasks.md)"),
        Variable("AIR_BASE_URL", _http_url, None, "an http(s) URL", "`--base-url`'s default"),
        Variable("AIR_MODEL", _text, None, "any text", "`--model`'s default"),
        Variable("AIR_RUN_ID", _run_id, None, "letters, digits, `.`, `_`, `-`; 63 at most",
                 "this process's run id (the `air.run` label of its containers); unset: a new one",
                 default_text="a new id per process"),
        Variable("AIR_KUBERNETES_NAMESPACE", dns_label, "air", "a DNS-1123 label",
                 "the kubernetes backend's namespace"),
        Variable("AIR_KUBERNETES_ENV_SERVER_CIDRS", _cidrs, [], "address blocks, comma-separated",
                 "address blocks the kubernetes NetworkPolicy admits an env server from", default_text="none"),
        Variable("AIR_KUBERNETES_RUNTIME_CLASS", dns_label, None, "a RuntimeClass's name",
                 "the kubernetes backend's RuntimeClass for every pod (e.g. gVisor's; docs/kubernetes.md)",
                 default_text="the node's default runtime"),
        Variable("AIR_CACHE_DIR", _folder, None, "a folder air can write", "air's cache (host secret, hidden draws)",
                 default_text="`$XDG_CACHE_HOME/air`, else `~/.cache/air`"),
        Variable("AIR_DATA_DIR", _folder, None, "a folder air can write", "the datasets store",
                 default_text="`$XDG_CACHE_HOME/air/data`, else `~/.cache/air/data`"),
        Variable("AIR_RUNTIME_DIR", _folder, None, "a folder air can write",
                 "sandboxes' host directories (the wardens' sockets)",
                 default_text="`/run/air` as root, else `$XDG_RUNTIME_DIR/air`, else `/tmp/air-UID`"),
        Variable("AIR_SQUASHFS_DIR", _folder_to_read, None, "a folder (`air images export-squashfs` makes it)",
                 "the enroot backend's images: squashfs files `air images export-squashfs` made (docs/hpc.md)",
                 default_text="`/var/cache/air/squashfs`"),
        Variable("AIR_TASKS_DIR", _path, None, "an existing folder", "the bundled tasks' folder",
                 default_text="air's own `tasks/`"),
        Variable("AIR_IMAGES_DIR", _path, None, "an existing folder", "the image recipes' folder",
                 default_text="air's own `images/`"),
        Variable("AIR_TRACEBACK", _text, None, "any non-empty text", "print the traceback of a bug in air (exit 4)"),
        Variable("AIR_AGENTGYM_TOKEN", _text, None, "any text", "`air serve agentgym --token`'s default", secret=True),
        Variable("AIR_OPENENV_TOKEN", _text, None, "any text", "`air serve openenv --token`'s default", secret=True),
        Variable("AIR_SNAPSHOT_KEY", _hex_key, None, "at least 16 bytes in hex",
                 "the key that seals snapshots, shared by hosts that trust each other's (docs/snapshots.md)",
                 default_text="a random key in air's cache folder", secret=True),
        Variable("AIR_PROGRESS", _choice("off", "stages", "rollouts", "turns"), "rollouts",
                 "`off`, `stages`, `rollouts` or `turns`",
                 "what progress lines say when stderr is not a terminal: nothing, the command's stages, also each "
                 "rollout's events and heartbeat, also each turn (docs/progress.md; `--quiet` is off)"),
        Variable("AIR_PROGRESS_HEARTBEAT", _float(0.1, 3600.0), 30.0, "0.1 to 3600 (seconds)",
                 "a heartbeat line for each rollout in flight that no line named for this long"),
        Variable("AIR_PROGRESS_STALL", _float(0.1, 86400.0), 120.0, "0.1 to 86400 (seconds)",
                 "a rollout waiting this long on one thing (the model, a command, scoring, a sandbox) is said "
                 "STALLED, with what it waits on"),
        Variable("AIR_PATIENCE", _patience, "auto", "`auto`, or 1 to 100",
                 "how many times its limits the host waits for a sandbox's warden (its start, a reset, the answer to "
                 "a command past the command's own timeout); `auto`: the node's load per CPU, 1 to 10 (docs/hpc.md)"),
        Variable("AIR_IMAGE_ROOTS_GB", _float(0.5, 4096.0), None, "0.5 to 4096 (GB)",
                 "the enroot backend's unpacked images in /dev/shm, this user's on this node, at most: the least "
                 "recently used no pool uses are removed first (docs/hpc.md)",
                 default_text="a quarter of /dev/shm's size"),
        Variable("AIR_IMAGE_ROOTS_HOURS", _float(0.0, 8760.0), 24.0, "0 to 8760 (hours)",
                 "an unpacked image in /dev/shm that no pool of this user used for this long is removed when the "
                 "next pool starts (docs/hpc.md)"),
        Variable("AIR_OFFLINE", _text, None, "any text; unset, empty, 0, false or no is off",
                 "build task Dockerfiles without the network (`--offline`)",
                 default_text="unset: with the network where the host has a default route"),
    ]
    return {row.name: row for row in rows}


VARIABLES = _table()


def raw(name: str) -> str | None:
    """The variable's text as set, None when unset or empty."""
    return os.environ.get(name) or None


def value(name: str) -> Any:
    """The variable's parsed value (its default when unset or empty); UsageError naming it when out of range."""
    var = VARIABLES[name]
    text = raw(name)
    if text is None:
        return var.default
    try:
        return var.parse(text)
    except _Bad as exc:
        shown = f"{name} (its value not shown: a secret)" if var.secret else f"{name}={shlex.quote(text)}"
        raise UsageError(f"{shown} {exc}; unset it for the default ({var.default_text}), or see "
                         "docs/variables.md") from None


def check_all() -> None:
    """Every set variable parsed: the first bad one is a UsageError."""
    for name in VARIABLES:
        value(name)


def secret_values() -> list[str]:
    """The values of the secret variables as set (what no line air prints may hold)."""
    return [text for name, var in VARIABLES.items() if var.secret and (text := raw(name))]


__all__ = ["AGENT_UID_BASE", "VARIABLES", "Variable", "check_all", "dns_label", "raw", "secret_values", "value"]
