"""Where a link of the agent's copy for scoring finally leads, through every other link.

A link is judged by where the kernel would take it, never by its text: `r -> /` and `x -> r/tests/expected.txt` are
each harmless-looking alone, and together reach the hidden expected output; `up -> ..` and `x -> sub/up/../..` leave
the workspace although `sub/up/../..` normalises to `.`. Two checks, each exact for what it can see:
- `final` (on the host, every contract): the path, followed component by component through every link of the copy;
  `..` applies to where a link led, not to its text.
- `refused_in_cell` (Harbor, whose links may point into the image): once the copy is unpacked in the scoring cell,
  each of the agent's links is followed there, as root, through the image's own links too (/var/run -> /run), by
  the same rule; a link read under /proc (a magic link: /proc/self/root, /dev/fd) is refused wherever it leads.
A link may not end in a place the test can write or that holds what the agent may not read, nor above one (`/`,
`/var`): a test that walks the tree through it (`cp -rL`, `find -L`) would reach them.
"""

from __future__ import annotations

import posixpath

from air.sandbox import WORKSPACE, Sandbox

MAX_HOPS = 40
"""Links followed for one path at most (the kernel's own limit): a loop is refused."""


def shown(name: str) -> str:
    """A name from the agent's tar as text for a message. The copy keeps names byte-exact (tarfile's surrogate
    escapes); what the agent and the records read is valid text (an undecodable byte becomes U+FFFD)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


WRITABLE_ROOTS = ("/home", "/root", "/srv", "/tmp", "/var/tmp", "/dev", "/proc", "/sys", "/run", "/tests", "/logs",
                  "/solution")
"""Where a Harbor workspace's absolute links may not point. Elsewhere (a venv's bin/python3 -> /opt/venv/bin/python3)
is the image's own root filesystem, read-only in every sandbox: nothing written through such a link lands, and
what is read through it is the image's, which the agent sees too. Here are the places a test can write (its
reward among them) or that hold what the agent may not read."""


def final(name: str, links: dict[str, str]) -> tuple[str, str]:
    """Where the workspace-relative path `name` leads, following every link of `links` (workspace-relative name ->
    target): ("inside", a workspace-relative path) or ("image", an absolute path, the rest of it taken as text).
    ValueError when it climbs above the workspace or loops."""
    parts: list[str] = []
    todo = name.split("/")
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ValueError("above the workspace")
            parts.pop()
            continue
        parts.append(part)
        target = links.get("/".join(parts))
        if target is None:
            continue
        hops += 1
        if hops > MAX_HOPS:
            raise ValueError("a loop of links")
        parts.pop()
        if target.startswith("/"):
            return "image", "/" + posixpath.normpath("/".join([target, *todo])).lstrip("/")
        todo = target.split("/") + todo
    return "inside", "/".join(parts)


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def refused(path: str, roots: tuple[str, ...]) -> bool:
    """An absolute path under one of `roots`, or above one (`/`, `/var`: a walk of the tree there reaches them)."""
    return any(under(path, top) or under(top, path) for top in roots)


# Run in the scoring cell as `python3 -I -S -c CHECK WORKSPACE ROOT...`: stdin holds the links' workspace-relative
# names, NUL-separated (bytes: names are the agent's); it prints the index of each link refused, one a line.
CHECK = r"""
import os, stat, sys
ws, refused_roots = sys.argv[1], sys.argv[2:]
def under(p, top):
    return p == top or p.startswith(top.rstrip("/") + "/")
def bad(p):
    return not under(p, ws) and any(under(p, top) or under(top, p) for top in refused_roots)
def lands(path):
    cur, todo, hops = "/", path.split("/"), 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            cur = os.path.dirname(cur)
            continue
        nxt = os.path.join(cur, part)
        try:
            mode = os.lstat(nxt).st_mode
        except OSError:
            cur = nxt
            continue
        if stat.S_ISLNK(mode):
            hops += 1
            if hops > 40 or under(cur, "/proc"):
                return None
            target = os.readlink(nxt)
            todo = target.split("/") + todo
            if target.startswith("/"):
                cur = "/"
            continue
        cur = nxt
    return cur
names = sys.stdin.buffer.read().split(b"\0")
for i, name in enumerate(names):
    if name:
        end = lands(os.path.join(ws, os.fsdecode(name)))
        if end is None or bad(end):
            print(i)
"""


async def refused_in_cell(scorer: Sandbox, names: list[str], refused_roots: tuple[str, ...],
                          env: dict[str, str]) -> list[str]:
    """The names of `names` (links of the copy, workspace-relative) that lead, in the scoring cell, to a place under
    `refused_roots` outside the workspace, or through /proc, or loop (all of them if the check could not run)."""
    if not names:
        return []
    data = b"\0".join(n.encode("utf-8", "surrogateescape") for n in names)
    result = await scorer.session.run_untrusted(["python3", "-I", "-S", "-c", CHECK, WORKSPACE, *refused_roots],
                                                stdin=data, user="root", cwd="/", env=env, timeout=120,
                                                whole_env=True)  # `env` alone: none of the task's (LD_PRELOAD...)
    if result.exit_code != 0:  # whatever made it fail is in the copy: none of its links is vouched for
        return names
    return [names[int(line)] for line in result.stdout.split() if line.isdigit() and int(line) < len(names)]


__all__ = ["MAX_HOPS", "WRITABLE_ROOTS", "final", "refused", "refused_in_cell", "shown", "under"]
