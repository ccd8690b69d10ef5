"""The program of a page-cache pin (docker/pagecache.py): a container of an image that holds every page of the
image's files in the host's page cache, for every sandbox of the image on the host. Runs in the pin's container
(stdlib only), as root with CAP_IPC_LOCK and nothing that could reach another container.

It walks what a sandbox of the image can read that the image itself carries (the root filesystem, the read-only data
mounts, Docker's init), holds all of it (pages.py), and says so. A pin for sandboxes with cells first copies the image
and its data into a tmpfs volume every such sandbox mounts (rootcopy.py: each cell's root), and holds that instead:
- with a host directory (a daemon on this machine): it holds `alive.lock` for as long as it lives and writes `ready`;
  every air process that relies on it holds a lock file under `holders/`. Once no holder has been alive for `grace`
  seconds it closes: `ready` becomes `closing`, the holders are looked at once more (one that came meanwhile keeps it
  open), and it exits. An air process that finds `closing` waits for the exit and starts a new pin. An idle pin
  closes before its grace is over when an air process about to pin another image, short of memory, leaves a
  `reclaim` file in its directory (docker/pagecache.py); a holder that comes first wins, and the file goes.
- without (a daemon elsewhere): it prints one line, `air-pinned ...`, and holds until its container is removed.
"""

from __future__ import annotations

import json
import os
import sys
import time

from air.sandbox.warden.locks import hold, lock_held
from air.sandbox.warden.pages import PinError, files_under, hold_in_children
from air.sandbox.warden.rootcopy import CopyError, make

HOST_DIR = "/run/air-pin"


def _holders(directory: str) -> int:
    """Live holders; the files of dead ones removed."""
    alive = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(directory, name)
        if lock_held(path):
            alive += 1
        else:
            _unlink(path)
    return alive


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write(path: str, text: str) -> None:
    with open(path + ".new", "w") as f:
        f.write(text)
    os.rename(path + ".new", path)


def main(config: dict) -> None:
    host = config.get("host_dir")
    if host:
        token = os.path.join(host, "token-" + config["token"])
        try:
            with open(token) as f:
                seen = f.read()
            os.unlink(token)
        except OSError:
            seen = None
        if seen != config["token"]:  # the daemon is not on the machine that made the directory
            print("air-pin-error this container does not see the host directory it was given", flush=True)
            sys.exit(3)
        hold(os.path.join(host, "alive.lock"))  # held until this process ends
        for stale in ("ready", "closing", "reclaim"):  # a pin before this one's words
            _unlink(os.path.join(host, stale))
    started = time.monotonic()
    copy_to = config.get("copy_to")
    try:
        if copy_to:  # cells' roots: the image and its data on a tmpfs of their own (rootcopy.py), whose pages it holds
            copied = make(["/", *config["data"]], copy_to, own_mounts=(copy_to, HOST_DIR))
            paths = files_under([copy_to])
        else:
            copied, paths = False, files_under(config["roots"], skip=config["skip"])
        _, files, size = hold_in_children(paths)
    except (PinError, CopyError, OSError) as exc:
        print("air-pin-error " + str(exc), flush=True)
        if host:
            _write(os.path.join(host, "error"), str(exc))
        sys.exit(2)
    report = {"files": files, "bytes": size, "seconds": round(time.monotonic() - started, 3)}
    if copy_to:
        report["copy"] = "made" if copied else "kept"
    print("air-pinned " + json.dumps(report), flush=True)
    if not host:
        if config.get("tethered"):  # held by its pool's process through stdin: gone when that process is
            while os.read(0, 1 << 16):
                pass
            sys.exit(0)
        while True:
            time.sleep(3600)
    ready, closing, holders, reclaim = (os.path.join(host, name) for name in ("ready", "closing", "holders",
                                                                              "reclaim"))
    _write(ready, json.dumps(report))
    idle_since = time.monotonic()
    while True:
        time.sleep(config.get("poll", 1.0))
        if _holders(holders):
            idle_since = time.monotonic()
            _unlink(reclaim)  # an ask meant for an idle pin, and this one is in use again
            continue
        if time.monotonic() - idle_since < config["grace"] and not os.path.exists(reclaim):
            continue
        os.rename(ready, closing)
        if _holders(holders):  # one came while we were deciding: stay
            os.rename(closing, ready)
            idle_since = time.monotonic()
            continue
        sys.exit(0)  # the children holding the pages die with the container's init
