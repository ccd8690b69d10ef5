#!/usr/bin/env python3
"""Merge settings into Docker's daemon.json, never replacing what else is there (ensure-docker.sh's live-restore
and CDI, gvisor-docker.sh's runsc runtime). Objects merge key by key; any other value replaces the old one. The file
is written only when the merge changes it, through a new file renamed over the old one, so a daemon that reads it
mid-write never sees half of it. Prints `changed` or `unchanged`; exit 1 (one line) when the file is not JSON.

    python3 scripts/daemon_json.py '{"live-restore": true}' [--file /etc/docker/daemon.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def merged(old: dict, new: dict) -> dict:
    out = dict(old)
    for key, value in new.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("settings", help="a JSON object to merge in")
    parser.add_argument("--file", default="/etc/docker/daemon.json")
    args = parser.parse_args()
    try:
        settings = json.loads(args.settings)
        text = Path(args.file).read_text() if os.path.exists(args.file) else ""
        config = json.loads(text) if text.strip() else {}
    except (OSError, ValueError) as exc:
        print(f"daemon_json: {exc}", file=sys.stderr)
        return 1
    if not isinstance(settings, dict) or not isinstance(config, dict):
        print(f"daemon_json: {args.file} and the settings must both be JSON objects", file=sys.stderr)
        return 1
    result = merged(config, settings)
    if result == config:
        print("unchanged")
        return 0
    os.makedirs(os.path.dirname(args.file) or ".", exist_ok=True)
    with open(args.file + ".new", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(args.file + ".new", args.file)
    print("changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
