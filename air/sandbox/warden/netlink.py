"""A cell's own interface on its sandbox's private network (a sandbox with services: air/sandbox/docker/services.py): a
macvlan of the container's interface, made straight into the cell's network namespace, with the cell's address, up,
and no route but its subnet's; deleted before the cell ends, so that no dying namespace answers for the address.
Stdlib only (the warden's): rtnetlink messages by hand, addresses and flags by ioctl."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from typing import Optional

RTM_NEWLINK, RTM_DELLINK, NLMSG_ERROR = 16, 17, 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFLA_IFNAME, IFLA_LINK, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 5, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, IFLA_MACVLAN_MODE, MACVLAN_MODE_BRIDGE = 1, 2, 1, 4
SIOCGIFFLAGS, SIOCSIFFLAGS, SIOCSIFADDR, SIOCSIFNETMASK = 0x8913, 0x8914, 0x8916, 0x891C
IFF_UP = 0x1
CELL_IFNAME = "eth0"


def _attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * (-length % 4)


def _request(sock: socket.socket, kind: int, flags: int, body: bytes) -> None:
    """Send one rtnetlink request and read its acknowledgement; OSError with the kernel's errno on a refusal."""
    header = struct.pack("=IHHII", 16 + len(body), kind, NLM_F_REQUEST | NLM_F_ACK | flags, 1, 0)
    sock.send(header + body)
    reply = sock.recv(65536)
    _, rtype, _, _, _ = struct.unpack_from("=IHHII", reply)
    if rtype == NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, 16)
        if error:
            raise OSError(-error, "rtnetlink: %s" % os.strerror(-error))


def route_socket() -> socket.socket:
    """An rtnetlink socket of the calling thread's network namespace (it stays that namespace's)."""
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)


def macvlan_into(sock: socket.socket, parent: int, netns_fd: int, name: str = CELL_IFNAME) -> None:
    """Make a macvlan (bridge mode) of interface `parent` of `sock`'s namespace, in the namespace `netns_fd`."""
    info = _attr(IFLA_INFO_KIND, b"macvlan\0") + _attr(IFLA_INFO_DATA, _attr(IFLA_MACVLAN_MODE, struct.pack(
        "=I", MACVLAN_MODE_BRIDGE)))
    body = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(IFLA_IFNAME, name.encode() + b"\0") + \
        _attr(IFLA_LINK, struct.pack("=I", parent)) + _attr(IFLA_NET_NS_FD, struct.pack("=I", netns_fd)) + \
        _attr(IFLA_LINKINFO, info)
    _request(sock, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)


def delete_link(sock: socket.socket, index: int) -> None:
    _request(sock, RTM_DELLINK, 0, struct.pack("=BxHiII", socket.AF_UNSPEC, 0, index, 0, 0))


def _ifreq_addr(name: str, address: str) -> bytes:
    return struct.pack("16sH2s4s8x", name.encode(), socket.AF_INET, b"\0\0", socket.inet_aton(address))


def configure(name: str, address: str, prefix: int) -> None:
    """In the calling thread's namespace: `name` gets `address`/`prefix` (its subnet's route alone) and comes up."""
    mask = socket.inet_ntoa(struct.pack("!I", (0xFFFFFFFF << (32 - prefix)) & 0xFFFFFFFF))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFADDR, _ifreq_addr(name, address))
        fcntl.ioctl(s, SIOCSIFNETMASK, _ifreq_addr(name, mask))
        ifr = struct.pack("16sh14x", name.encode(), 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh14x", name.encode(), flags | IFF_UP))


def split(cidr: str) -> Optional[tuple]:
    """"10.213.0.29/27" -> ("10.213.0.29", 27); "" -> None."""
    if not cidr:
        return None
    address, _, prefix = cidr.partition("/")
    return address, int(prefix or 32)
