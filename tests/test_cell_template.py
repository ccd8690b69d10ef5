"""Every cell's mounts start from what the warden made once per sandbox (warden/cell.py: `_make_template`, a mount
namespace each cell's is a copy of; `Layout._fill_shared`, the host view's tmpfs that the cgroup limits and /proc's
empty masks are binds of): the parts every cell shares. Root in one cell (an evaluation reading hidden data) tries to
leave something in each of them, and in /srv/air/out, which each cell gets as the warden has it then (moved into the
copy); the next cell must find all of them as the first cell found them before the attack.

Positive control: the same attack on a place that cell A can write (a directory of its own /tmp) changes what the
same probe reads there, in cell A: the probe sees what the attack leaves wherever it can leave something.
"""

from __future__ import annotations

import json

import pytest
from conftest import ENROOT

pytestmark = pytest.mark.docker

SHARED = ["/sys/fs/cgroup", "/proc/acpi", "/sys/kernel/mm/ksm", "/etc", "/srv/air"]
"""Parts of every cell that come from the sandbox's template or its shared tmpfs (read-only in every cell)."""
RENEWED = ["/srv/air/out"]
"""root's writable place whose mount a cell takes from the warden when it is built (a new one for each cell)."""

PROBE = r'''
import json, os, sys
seen = {}
for top in sys.argv[1:]:
    for d, dirs, files in os.walk(top):
        dirs[:] = [n for n in dirs if not os.path.ismount(os.path.join(d, n))]  # another mount: not this part
        for name in ["."] + sorted(dirs + files):
            path = os.path.normpath(os.path.join(d, name))
            try:
                st = os.lstat(path)
                xattrs = sorted(os.listxattr(path, follow_symlinks=False))
            except OSError:
                continue
            seen[path] = [st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns, xattrs]
print(json.dumps(seen))
'''

ATTACK = r'''
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def attempts(top):
    yield lambda: open(os.path.join(top, "left-by-a"), "w").write("hidden")
    yield lambda: os.mkdir(os.path.join(top, "dir-by-a"))
    yield lambda: os.utime(top, (1, 1))
    yield lambda: os.chmod(top, 0o777)
    yield lambda: os.chown(top, 1234, 1234)
    yield lambda: os.setxattr(top, "user.left", b"hidden")
    yield lambda: os.setxattr(top, "trusted.left", b"hidden")
    yield lambda: libc.mount(b"none", top.encode(), b"tmpfs", 0, None) == 0 or (_ for _ in ()).throw(OSError())
for top in sys.argv[1:]:
    for attempt in attempts(top):
        try:
            attempt()
            print("changed", top)
        except OSError:
            pass
'''


async def _probe(sb, places: list[str]) -> dict:
    r = await sb.session.run_untrusted(["python3", "-c", PROBE, *places], user="root", cwd="/")
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.skipif(ENROOT, reason="the enroot backend makes each cell's root itself (no template)")
async def test_root_in_one_cell_leaves_nothing_in_the_shared_parts_for_the_next(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        assert sb.cells
        before = await _probe(sb, SHARED)
        assert any(p.startswith("/sys/fs/cgroup/") for p in before) and "/proc/acpi" in before

        # Positive control: where cell A can write, the attack changes what the probe reads (in cell A).
        await sb.session.run_untrusted(["mkdir", "/tmp/control"], user="root", cwd="/")
        control = await _probe(sb, ["/tmp/control"])
        r = await sb.session.run_untrusted(["python3", "-c", ATTACK, "/tmp/control", *RENEWED], user="root",
                                           cwd="/")
        assert "changed /tmp/control" in r.stdout and "changed /srv/air/out" in r.stdout, r.stdout
        assert await _probe(sb, ["/tmp/control"]) != control
        assert "/srv/air/out/left-by-a" in await _probe(sb, RENEWED)

        # The attack on the shared parts: read-only to root in a cell (no mount, no write, no times).
        r = await sb.session.run_untrusted(["python3", "-c", ATTACK, *SHARED], user="root", cwd="/")
        assert r.exit_code == 0, r.stderr
        assert r.stdout == "", "root changed a shared part of the cell: " + r.stdout

        await sb.session.reset()
        after = await _probe(sb, SHARED)
        renewed = await _probe(sb, RENEWED)
    assert after == before
    assert not any("by-a" in path for path in renewed), renewed
