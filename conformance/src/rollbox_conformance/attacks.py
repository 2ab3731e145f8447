"""Escape attempts that need nothing from the host: privileged operations, devices,
kernel interfaces, the network. Each is a script run inside the sandbox.

Protocol: a script exits 0 if the attempt SUCCEEDED (the sandbox failed), 77 if the
image lacks what the attempt needs (the test skips, it does not pass), anything else if
the attempt was blocked. Where an attempt could change the machine, the script undoes
it (writes back the value it read, removes what it made): run unconfined, every
attempt here is harmless.
"""

from __future__ import annotations

from dataclasses import dataclass

SHELL_PRELUDE = 'need() { command -v "$1" >/dev/null 2>&1 || exit 77; }\n'

PYTHON_RUNNER = "command -v python3 >/dev/null 2>&1 || exit 77; exec python3 -"

PYTHON_PRELUDE = """\
import ctypes, errno, os, platform, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def nr(x86_64, aarch64):
    number = {"x86_64": x86_64, "aarch64": aarch64}.get(platform.machine())
    if number is None:
        sys.exit(77)
    return number

def syscall(number, *args):
    ctypes.set_errno(0)
    return libc.syscall(number, *args), ctypes.get_errno()
"""


@dataclass(frozen=True)
class Attack:
    """One escape attempt. ``python`` scripts run under ``python3 -`` (skip if absent);
    ``network`` attempts only make sense when the spec allows no network."""

    id: str
    what: str
    script: str
    python: bool = False
    network: bool = False

    def command(self) -> tuple[str, bytes | None]:
        """The shell command and stdin that carry this attempt out."""
        if self.python:
            return PYTHON_RUNNER, (PYTHON_PRELUDE + self.script).encode()
        return SHELL_PRELUDE + self.script, None


def _write_back(paths: list[str]) -> str:
    """Succeeds if any of ``paths`` accepts its own current value back (a no-op write)."""
    return (
        f"for f in {' '.join(paths)}; do\n"
        '  [ -f "$f" ] || continue; v=$(cat "$f" 2>/dev/null) || continue\n'
        '  (printf "%s\\n" "$v" > "$f") 2>/dev/null && exit 0\n'
        "done; exit 1\n"
    )


def _socket_families(families: dict[str, int]) -> str:
    """Succeeds if a socket of any of ``families`` (by number: Python may lack the name)
    can be made, of any type."""
    return (
        f"families = {families!r}\n"
        "made = []\n"
        "for name, family in families.items():\n"
        "    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET,\n"
        "                 socket.SOCK_RAW):\n"
        "        try:\n            socket.socket(family, kind).close()\n"
        "        except OSError:\n            continue\n"
        "        made.append(name)\n        break\n"
        "print(' '.join(made))\n"
        "sys.exit(0 if made else 1)\n"
    )


UNNEEDED_FAMILIES = {
    "AF_AX25": 3, "AF_IPX": 4, "AF_APPLETALK": 5, "AF_X25": 9, "AF_KEY": 15, "AF_RDS": 21,
    "AF_PPPOX": 24, "AF_LLC": 26, "AF_CAN": 29, "AF_TIPC": 30, "AF_BLUETOOTH": 31,
    "AF_RXRPC": 33, "AF_PHONET": 35, "AF_IEEE802154": 36, "AF_CAIF": 37, "AF_ALG": 38,
    "AF_NFC": 39, "AF_KCM": 41, "AF_QIPCRTR": 42, "AF_SMC": 43, "AF_XDP": 44, "AF_MCTP": 45,
}
"""Socket families a sandbox without network has no use for: other link layers and
protocols, key management, kernel crypto. Each is kernel attack surface (and on a host
whose kernel has them as modules, asking for one may load it)."""


ATTACKS: tuple[Attack, ...] = (
    Attack("mount-tmpfs", "mount a tmpfs",
           'need mount; d=$(mktemp -d) || exit 2\n'
           'if mount -t tmpfs rbx "$d" 2>/dev/null; then umount "$d"; exit 0; fi; exit 1\n'),
    Attack("mount-proc", "mount a fresh procfs",
           'need mount; d=$(mktemp -d) || exit 2\n'
           'if mount -t proc proc "$d" 2>/dev/null; then umount "$d"; exit 0; fi; exit 1\n'),
    Attack("remount-root", "remount / read-write",
           "need mount; mount -o remount,rw / 2>/dev/null && exit 0; exit 1\n"),
    Attack("unshare-user", "create a user namespace (become root in it)",
           "need unshare; unshare -U true 2>/dev/null && exit 0; exit 1\n"),
    Attack("unshare-mount", "create a mount namespace",
           "need unshare; unshare -m true 2>/dev/null && exit 0; exit 1\n"),
    Attack("unshare-net", "create a network namespace",
           "need unshare; unshare -n true 2>/dev/null && exit 0; exit 1\n"),
    Attack("nsenter-init", "enter the namespaces of pid 1",
           "need nsenter; nsenter -t 1 -m -n true 2>/dev/null && exit 0; exit 1\n"),
    Attack("chroot", "chroot (CAP_SYS_CHROOT)",
           "need chroot; chroot / true 2>/dev/null && exit 0; exit 1\n"),
    Attack("ambient-caps", "raise CAP_SYS_ADMIN into the ambient set",
           "need setpriv\n"
           "setpriv --inh-caps=+sys_admin --ambient-caps=+sys_admin true 2>/dev/null "
           "&& exit 0; exit 1\n"),
    Attack("capabilities-held", "hold any effective, permitted or ambient capability",
           'fields = [l.split(":") for l in open("/proc/self/status") if l.startswith('
           '("CapEff", "CapPrm", "CapAmb"))]\n'
           "sys.exit(0 if any(int(v, 16) for _, v in fields) else 1)\n", python=True),
    Attack("setuid", "switch to another uid",
           "u = os.getuid(); t = u + 1 if u < 60000 else u - 1\n"
           "try:\n    os.setresuid(t, t, t)\nexcept OSError:\n    sys.exit(1)\nsys.exit(0)\n",
           python=True),
    Attack("setgroups", "join group 0",
           "try:\n    os.setgroups([0])\nexcept OSError:\n    sys.exit(1)\nsys.exit(0)\n",
           python=True),
    Attack("keyctl", "add a key to the kernel keyring",
           'r, e = syscall(nr(248, 217), b"user", b"rbx-conformance", b"x", 1, -3)\n'
           "sys.exit(0 if r >= 0 else 1)\n", python=True),
    Attack("init-module", "pass the privilege check of init_module",
           "buf = ctypes.create_string_buffer(64)\n"
           'r, e = syscall(nr(175, 105), buf, 64, b"")\n'
           "sys.exit(1 if e in (errno.EPERM, errno.EACCES, errno.ENOSYS) else 0)\n",
           python=True),
    Attack("raw-socket", "open a raw IP socket (CAP_NET_RAW)",
           "try:\n    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()\n"
           "except OSError:\n    sys.exit(1)\nsys.exit(0)\n", python=True),
    Attack("packet-socket", "open a packet socket (sniff the host's traffic)",
           "try:\n    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()\n"
           "except OSError:\n    sys.exit(1)\nsys.exit(0)\n", python=True),
    Attack("dev-mem", "read /dev/mem",
           "[ -e /dev/mem ] || exit 1; head -c 1 /dev/mem >/dev/null 2>&1 && exit 0; exit 1\n"),
    Attack("proc-kcore", "read /proc/kcore",
           "[ -e /proc/kcore ] || exit 1\n"
           "head -c 1 /proc/kcore >/dev/null 2>&1 && exit 0; exit 1\n"),
    Attack("dev-kmsg", "read the kernel log through /dev/kmsg",
           "[ -e /dev/kmsg ] || exit 1; need dd\n"
           "out=$(dd if=/dev/kmsg bs=8192 count=1 iflag=nonblock 2>/dev/null)\n"
           '[ -n "$out" ] && exit 0; exit 1\n'),
    Attack("kallsyms", "see kernel symbol addresses",
           "[ -r /proc/kallsyms ] || exit 1\n"
           "a=$(head -n 1 /proc/kallsyms | cut -d' ' -f1)\n"
           '[ -n "$a" ] && [ -n "$(printf %s "$a" | tr -d 0)" ] && exit 0; exit 1\n'),
    Attack("block-device", "read a raw disk",
           "for d in /dev/sd? /dev/vd? /dev/xvd? /dev/nvme?n? /dev/mmcblk? /dev/dm-?; do\n"
           '  [ -b "$d" ] && head -c 512 "$d" >/dev/null 2>&1 && exit 0\ndone; exit 1\n'),
    Attack("mknod", "create a character device node",
           'need mknod; d=$(mktemp -d) || exit 2\n'
           'if mknod "$d/mem" c 1 1 2>/dev/null; then rm -f "$d/mem"; exit 0; fi; exit 1\n'),
    Attack("write-sys", "write to /sys",
           _write_back(["/sys/kernel/mm/transparent_hugepage/khugepaged/defrag",
                        "/sys/kernel/mm/ksm/run", "/sys/module/printk/parameters/time",
                        "/sys/kernel/profiling"])),
    Attack("write-proc-sys", "write to /proc/sys",
           _write_back(["/proc/sys/vm/swappiness", "/proc/sys/vm/overcommit_ratio",
                        "/proc/sys/kernel/printk_ratelimit", "/proc/sys/fs/file-max"])),
    Attack("sysrq", "trigger a magic SysRq (h: print help)",
           "[ -e /proc/sysrq-trigger ] || exit 1\n"
           "(printf h > /proc/sysrq-trigger) 2>/dev/null && exit 0; exit 1\n"),
    Attack("hostname", "set the hostname",
           _write_back(["/proc/sys/kernel/hostname"])),
    Attack("ip-link-add", "create a network interface",
           "need ip\n"
           "if ip link add rbxconf0 type dummy 2>/dev/null; then ip link del rbxconf0; exit 0; fi\n"
           "exit 1\n"),
    Attack("runtime-socket", "find a container runtime socket",
           "for s in /var/run/docker.sock /run/docker.sock /run/containerd/containerd.sock "
           "/run/podman/podman.sock /run/crio/crio.sock; do [ -S \"$s\" ] && exit 0; done\n"
           "exit 1\n"),
    Attack("dns", "resolve a public name", network=True,
           script="need getent\n"
           "for n in pypi.org example.com; do getent hosts $n >/dev/null 2>&1 && exit 0; done\n"
           "exit 1\n"),
    Attack("internet-tcp", "open a TCP connection to the internet", network=True, python=True,
           script="for address in ((\"1.1.1.1\", 443), (\"8.8.8.8\", 53)):\n"
           "    s = socket.socket(); s.settimeout(1.5)\n"
           "    try:\n        s.connect(address)\n        sys.exit(0)\n"
           "    except OSError:\n        pass\n    finally:\n        s.close()\n"
           "sys.exit(1)\n"),
    Attack("vsock", "open an AF_VSOCK socket (to the hypervisor or host)", network=True,
           python=True, script=_socket_families({"AF_VSOCK": 40})),
    Attack("socket-families", "open a socket of a family no sandbox without network needs",
           network=True, python=True, script=_socket_families(UNNEEDED_FAMILIES)),
)
