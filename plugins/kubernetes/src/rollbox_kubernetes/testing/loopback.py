"""Who listens where on this machine's loopback, read from ``/proc/net/tcp``.

A test cluster serves its pods' runtimes on addresses of 127/8, which it shares with
everything else on the machine: other test clusters (a benchmark's, beside the test
session's), test servers, a developer's own. These let the cluster pick a pod CIDR
nobody listens in and name the holder of an address it finds taken."""

from __future__ import annotations

import ipaddress
import os
import random
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

LISTEN = "0A"
"""``st`` of a listening socket in /proc/net/tcp."""


def listeners() -> Iterator[tuple[str, int, str]]:
    """(address, port, socket inode) of every listening IPv4 TCP socket of this network
    namespace."""
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        hex_addr, hex_port = fields[1].split(":")
        addr = socket.inet_ntoa(struct.pack("<I", int(hex_addr, 16)))
        yield addr, int(hex_port, 16), fields[9]


def listener_of(ip: str, port: int) -> str:
    """Which process listens on ``ip:port`` (or on the wildcard address at ``port``),
    for a message: ``"pid 123 (python3)"``, or what little is known."""
    inodes = {inode for addr, p, inode in listeners()
              if p == port and addr in (ip, "0.0.0.0")}
    if not inodes:
        return "no listener seen now"
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in wanted for fd in fds):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                return f"pid {pid} ({cmd.decode(errors='replace').strip()[:200]})"
        except OSError:
            continue
    return f"socket inode {', '.join(sorted(inodes))}, owner not found"


def quiet_cidr(first: int = 64, last: int = 95) -> str:
    """A ``127.N.0.0/16`` with ``first <= N <= last`` in which nothing listens now,
    chosen at random among those (two clusters starting at once rarely pick the same),
    or any of them if all are in use."""
    used = {int(ipaddress.IPv4Address(addr).packed[1]) for addr, _, _ in listeners()
            if addr.startswith("127.")}
    choices = [n for n in range(first, last + 1) if n not in used]
    return f"127.{random.choice(choices or range(first, last + 1))}.0.0/16"
