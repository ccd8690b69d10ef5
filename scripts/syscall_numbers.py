#!/usr/bin/env python3
"""Print the syscall numbers the cells' seccomp filter needs (air/sandbox/warden/syscalls.py), read from this
machine's kernel headers (Debian's linux-libc-dev): x86_64 from asm/unistd_64.h, aarch64 from asm-generic/unistd.h
with the arch's own switches (arch/arm64/include/uapi/asm/unistd.h). Numbers from 451 on (Linux 6.5+) are shared by
both and newer than these headers may be: they are listed by hand in syscalls.py.

    python3 scripts/syscall_numbers.py > /tmp/numbers.py   # then paste into air/sandbox/warden/syscalls.py
"""

import re
import subprocess
import sys

AARCH64_SWITCHES = ("__ARCH_WANT_RENAMEAT", "__ARCH_WANT_NEW_STAT", "__ARCH_WANT_SET_GET_RLIMIT",
                    "__ARCH_WANT_TIME32_SYSCALLS", "__ARCH_WANT_SYS_CLONE3", "__ARCH_WANT_MEMFD_SECRET")


def macros(source: str) -> dict[str, int]:
    out = subprocess.run(["gcc", "-E", "-dM", "-"], input=source, capture_output=True, text=True, check=True).stdout
    raw = dict(re.findall(r"^#define (__NR(?:3264)?_\w+) (\S+)$", out, re.M))

    def value(name: str, depth: int = 0) -> int | None:
        v = raw.get(name)
        if v is None or depth > 5:
            return None
        return int(v, 0) if re.fullmatch(r"\d+", v) else value(v, depth + 1)

    return {n[len("__NR_"):]: value(n) for n in raw if n.startswith("__NR_") and value(n) is not None}


def main() -> None:
    x86 = macros("#include <asm/unistd_64.h>\n")
    arm = macros("#define __BITS_PER_LONG 64\n" + "".join(f"#define {s}\n" for s in AARCH64_SWITCHES)
                 + "#include <asm-generic/unistd.h>\n")
    for table in (x86, arm):
        table.pop("syscalls", None)
    sys.stdout.write("X86_64 = " + repr(dict(sorted(x86.items()))) + "\n")
    sys.stdout.write("AARCH64 = " + repr(dict(sorted(arm.items()))) + "\n")


if __name__ == "__main__":
    if sys.argv[1:]:  # it takes no arguments: --help prints what it does, anything else is refused
        print(__doc__, file=sys.stdout if sys.argv[1:] in (["-h"], ["--help"]) else sys.stderr)
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    main()
