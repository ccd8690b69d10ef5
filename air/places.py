"""Folders air makes for one user where every user may make folders: /tmp/air-<uid> and `$XDG_RUNTIME_DIR/air` (the
sandboxes' host directories: air/sandbox/hostdir.py), /dev/shm/air-<uid> (the enroot backend's images' roots:
air/sandbox/enroot/copies.py).

Anyone can `mkdir` such a name first. A folder another user made (or a link, or one others may write) is never used:
its maker could read what air keeps there, plant an image's root every cell then runs on, or, as before, stop every
later air of the user (chmod failed: "Operation not permitted", a traceback from the Python API). Instead air takes a
place of its own beside it, `<name>-<token>`, whose token only this user can compute (an HMAC of the name and the
node under a key in the user's own cache folder, `places.key`), so every air process of the user finds the same one
and nobody can make it ahead; it says so once per process, in one line naming the folder's owner. Where every place
it may take is someone else's, it refuses in one line naming them (exit 2).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import pwd
import secrets
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from air.errors import UsageError

log = logging.getLogger("air.places")
TRIES = 8
"""Places of its own air tries beside a taken folder, each with a token of its own."""
KEY = "places.key"
_chosen: dict[tuple[str, int], Path] = {}
"""What `private` settled on in this process, by the folder asked and the user: said once, checked once."""


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def why_not_mine(path: Path) -> str | None:
    """None when `path` is a folder this user owns, that is not a link and that nobody else may write (it is
    then made 0700); else why it is not to be used. FileNotFoundError where nothing is there."""
    st = os.lstat(path)
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a link made by {owner_name(st.st_uid)}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder ({owner_name(st.st_uid)} made it)"
    if st.st_uid != me:
        return f"{path} belongs to {owner_name(st.st_uid)}"
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)  # ours: nobody else may look in or write
    return None


def _claim(path: Path) -> str | None:
    """Make `path` this user's private folder (its parent must exist), or say why it cannot be."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    else:
        os.chmod(path, 0o700)  # mkdir's mode is under the umask; nobody else may look in
        return None
    try:
        return why_not_mine(path)
    except FileNotFoundError:  # removed between the two: try once more
        return _claim(path)


def _key(make: bool = True) -> bytes | None:
    """This user's key for the tokens (made once, 0600, in air's cache folder under the user's home; None where
    there is none and `make` is off)."""
    from air.paths import cache_dir, cache_path

    path = (cache_dir() if make else cache_path()) / KEY
    with contextlib.suppress(FileNotFoundError):
        if os.stat(path).st_uid == os.geteuid():
            key = path.read_bytes()
            if len(key) >= 32:
                return key
    if not make:
        return None
    tmp = path.with_name(f".{KEY}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    os.replace(tmp, path)
    return path.read_bytes()


def candidates(path: Path, make_key: bool = True) -> Iterator[Path]:
    """Where air may keep `path`'s contents for this user: `path`, then its places of its own (none without a key
    where `make_key` is off: none was ever made)."""
    yield path
    key = _key(make_key)
    if key is None:
        return
    for attempt in range(TRIES):
        message = f"{socket.gethostname()}\0{os.geteuid()}\0{path}\0{attempt}".encode()
        yield path.with_name(f"{path.name}-{hmac.new(key, message, hashlib.sha256).hexdigest()[:16]}")


def private(path: Path, *, parents: bool = False) -> Path:
    """This user's private folder `path` (made 0700 if missing), or, where another user holds it, a place of air's
    own beside it (said once, in one line); UsageError (exit 2, one line) when every place is taken."""
    known = _chosen.get((str(path), os.geteuid()))
    if known is not None and known.is_dir():
        return known
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    taken: list[str] = []
    for place in candidates(path):
        why = _claim(place)
        if why is None:
            if taken:
                log.warning("%s, not you: air uses %s instead", taken[0], place)
            _chosen[(str(path), os.geteuid())] = place
            return place
        taken.append(why)
    raise UsageError(f"{taken[0]}, not you ({owner_name(os.geteuid())}), and so are {len(taken) - 1} places of "
                     f"air's own beside it: ask root to remove them (another user made them), or set "
                     "AIR_RUNTIME_DIR to a folder of yours")


def present(path: Path) -> Path | None:
    """The place `private` would settle on, where it exists already and is this user's (nothing made)."""
    for place in candidates(path, make_key=False):
        with contextlib.suppress(FileNotFoundError):
            if why_not_mine(place) is None:
                return place
    return None
