#!/usr/bin/env python3
"""Merge settings into Docker's daemon.json, never replacing what else is there (ensure-docker.sh's live-restore
and CDI, gvisor-docker.sh's runsc runtime). Objects merge key by key; any other value replaces the old one. The file
is written only when the merge changes it: a new file in the same folder, written and flushed to disk, then renamed
over the old one, so a daemon that reads it mid-write, or a machine that loses power, never sees half of it. A link
is followed (its target is edited; the link stays); the file keeps its mode and owner (a new one is 0644). Only
strict JSON is read or written (NaN and Infinity, which Docker's parser refuses, are refused). Prints `changed` or
`unchanged`.

Exit codes: 0 written or unchanged; 1 the file cannot be read, is not a JSON object, or cannot be written (a full or
read-only file system: the file is left as it was, and no temporary file stays), said in one line naming it; 2 the
settings are not a JSON object (and argparse's usage errors).

    python3 scripts/daemon_json.py '{"live-restore": true}' [--file /etc/docker/daemon.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile

NEW_MODE = 0o644
"""A daemon.json made here: readable by every user, as Docker's packages make it."""


def merged(old: dict, new: dict) -> dict:
    out = dict(old)
    for key, value in new.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (Docker's parser refuses it)")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is out of a float's range")
    return number


def strict(text: str) -> object:
    """JSON as Docker reads it: NaN, Infinity and -Infinity (which Python's parser takes), and numbers past a float's
    range (1e999, which it reads as infinity), are refused."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deeply") from None


class Refused(Exception):
    """One line for the user; the exit code it ends with."""

    def __init__(self, line: str, code: int = 1):
        super().__init__(line)
        self.code = code


def _why(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]


def write(path: str, text: str) -> None:
    """`text` into `path` (a link's target), atomically: a temporary file in the same folder with the old file's
    mode and owner, fsynced, renamed over it, and the folder fsynced. On any failure the temporary file is removed
    and the old file is as it was."""
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".new")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if old is not None:
                if (old.st_uid, old.st_gid) != (os.getuid(), os.getgid()):
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
                os.fchmod(f.fileno(), old.st_mode & 0o7777)
            else:
                os.fchmod(f.fileno(), NEW_MODE)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # the rename itself on disk
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def run(settings_text: str, file: str) -> str:
    try:
        settings = strict(settings_text)
    except ValueError as exc:
        raise Refused(f"the settings are not JSON ({_why(exc)})", 2) from None
    if not isinstance(settings, dict):
        raise Refused("the settings must be a JSON object ({...})", 2)
    path = os.path.realpath(file)  # a link's target is what is edited; the link stays a link
    shown = file if path == os.path.abspath(file) else f"{file} (-> {path})"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise Refused(f"{shown} cannot be read: {_why(exc)}") from None
    try:
        config = strict(text) if text.strip() else {}
    except ValueError as exc:
        raise Refused(f"{shown} is not JSON ({_why(exc)}); fix it or move it away") from None
    if not isinstance(config, dict):
        raise Refused(f"{shown} holds JSON that is not an object; fix it or move it away")
    result = merged(config, settings)
    if result == config:
        return "unchanged"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write(path, json.dumps(result, indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        raise Refused(f"{shown} cannot be written: {_why(exc)} (left as it was)") from None
    return "changed"


def main(argv: list[str] | None = None) -> int:
    what, *rest = __doc__.split("\n\n")
    parser = argparse.ArgumentParser(description=what, epilog="\n\n".join(rest),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("settings", help="a JSON object to merge in")
    parser.add_argument("--file", default="/etc/docker/daemon.json")
    args = parser.parse_args(argv)
    try:
        print(run(args.settings, args.file))
    except Refused as exc:
        print(f"daemon_json: {exc}", file=sys.stderr)
        return exc.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
