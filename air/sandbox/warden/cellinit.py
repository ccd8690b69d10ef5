r"""A cell's init as a program of its own (issue 74): 330 bytes of x86-64 machine code in a minimal static ELF, run
from a memfd, instead of a shell. Runs in the warden (stdlib only).

A cell's init (cell._build_in_thread) is pid 1 of the cell's pid namespace. The shell that was it (cell.INIT_SCRIPT)
cost about a millisecond of CPU a cell, most of it the dynamic loading and start of /bin/sh and the fork of its
subshell. This program does what that script does, with system calls alone:
- closes every descriptor but 0, 1 and 2 (close_range: the memfd it was run from), and names itself air-cell-init
  (its comm would be the memfd's descriptor number, the last part of the path it was run by);
- ignores HUP, INT, QUIT, TERM, USR1, USR2, PIPE and ALRM (the script's trap; signals from inside the cell reach no
  pid 1 anyway unless it handles them), SIGCHLD at its default;
- forks a child that stops itself (kill(0, SIGSTOP): its process group, which pid 1 ignores), so that the cell's
  first process is pid 3 in every cell, then says `ready` on stdout and points stdout at /dev/null;
- waits for every child that ends (orphans come to pid 1), forever; where the stopped child ended (someone in the
  cell continued or killed it), it forks another, as the script's loop does.

The source, assembled with GNU as (`as init.s && objcopy -O binary -j .text`); the bytes below are its output:

    _start:  mov eax, 436 ; mov edi, 3 ; mov esi, -1 ; xor edx, edx ; syscall          # close_range(3, ~0, 0)
             mov eax, 157 ; mov edi, 15 ; lea rsi, [rip + name] ; syscall               # prctl(PR_SET_NAME, name)
             sub rsp, 32 ; mov qword ptr [rsp], 1 ; xor eax, eax                        # struct sigaction: SIG_IGN
             mov [rsp+8], rax ; mov [rsp+16], rax ; mov [rsp+24], rax
             lea rbx, [rip + sigs]
    1:       movzx edi, byte ptr [rbx] ; test edi, edi ; jz 2f
             mov eax, 13 ; mov rsi, rsp ; xor edx, edx ; mov r10d, 8 ; syscall          # rt_sigaction(sig, &act, 0, 8)
             inc rbx ; jmp 1b
    2:       mov qword ptr [rsp], 0                                                     # SIGCHLD: SIG_DFL
             mov eax, 13 ; mov edi, 17 ; mov rsi, rsp ; xor edx, edx ; mov r10d, 8 ; syscall
             call stopper
             mov eax, 1 ; mov edi, 1 ; lea rsi, [rip + ready] ; mov edx, 6 ; syscall   # write(1, "ready\n", 6)
             mov eax, 2 ; lea rdi, [rip + devnull] ; mov esi, 1 ; xor edx, edx ; syscall  # open O_WRONLY
             mov r13, rax ; mov eax, 33 ; mov rdi, r13 ; mov esi, 1 ; syscall           # dup2(fd, 1)
             mov eax, 3 ; mov rdi, r13 ; syscall                                        # close(fd)
    3:       mov eax, 61 ; mov rdi, -1 ; xor esi, esi ; xor edx, edx ; xor r10d, r10d ; syscall  # wait4(-1, 0, 0, 0)
             cmp rax, -10 ; je 4f                                                       # ECHILD
             cmp rax, r12 ; jne 3b                                                      # not the stopped child
    4:       call stopper ; jmp 3b
    stopper: mov eax, 57 ; syscall ; test rax, rax ; jnz 5f                             # fork
             mov eax, 62 ; xor edi, edi ; mov esi, 19 ; syscall                         # kill(0, SIGSTOP)
             mov eax, 60 ; xor edi, edi ; syscall                                       # continued: exit(0)
    5:       mov r12, rax ; ret
    sigs:    .byte 1, 2, 3, 15, 10, 12, 13, 14, 0
    ready:   .ascii "ready\n"
    devnull: .asciz "/dev/null"
    name:    .asciz "air-cell-init"

Other machines keep the shell (program returns None there).
"""

from __future__ import annotations

import binascii
import fcntl
import os
import platform
import struct
from typing import Optional

X86_64 = binascii.unhexlify(
    "b8b4010000bf03000000beffffffff31d20f05b89d000000bf0f000000488d35180100000f054883ec2048c704240100000031c0488944"
    "240848894424104889442418488d1dd90000000fb63b85ff7417b80d0000004889e631d241ba080000000f0548ffc3ebe248c704240000"
    "0000b80d000000bf110000004889e631d241ba080000000f05e870000000b801000000bf01000000488d358f000000ba060000000f05b8"
    "02000000488d3d82000000be0100000031d20f054989c5b8210000004c89efbe010000000f05b8030000004c89ef0f05b83d00000048c7"
    "c7ffffffff31f631d24531d20f054883f8f674054c39e075e0e802000000ebd9b8390000000f054885c07517b83e00000031ffbe130000"
    "000f05b83c00000031ff0f054989c4c30102030f0a0c0d0e0072656164790a2f6465762f6e756c6c006169722d63656c6c2d696e697400")
BASE = 0x400000
NAME = "air-cell-init"
"""Its name: argv[0], its comm (PR_SET_NAME) and the memfd's (/proc/1/exe, which only root of the cell reads)."""


def elf(code: bytes, machine: int) -> bytes:
    """A static executable of position-independent `code`: one ELF header, one loadable segment (read, execute) that
    holds the file whole, the entry right after the headers."""
    header, segment = 64, 56
    size = header + segment + len(code)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little-endian, version 1, System V
    return (struct.pack("<16sHHIQQQIHHHHHH", ident, 2, machine, 1, BASE + header + segment, header, 0, 0, header,
                        segment, 1, 0, 0, 0)
            + struct.pack("<IIQQQQQQ", 1, 5, 0, BASE, BASE, size, size, 0x1000) + code)


def program() -> Optional[bytes]:
    """The init for this machine, or None where there is none (the shell then)."""
    if platform.machine() in ("x86_64", "amd64") and os.uname().sysname == "Linux":
        return elf(X86_64, 0x3E)
    return None


_FD: Optional[int] = None


def memfd() -> Optional[int]:
    """A memfd holding the init, made once per warden (sealed: nothing can change it), or None."""
    global _FD
    if _FD is None:
        code = program()
        if code is None:
            return None
        fd = os.memfd_create(NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.write(fd, code)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
                    | fcntl.F_SEAL_WRITE)
        _FD = fd
    return _FD
