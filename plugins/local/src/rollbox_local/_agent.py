"""The zygote and the in-sandbox agent: how commands get into a sandbox fast.

This file runs as ``python -I -S _agent.py FD`` and imports nothing from rollbox or
outside the standard library, so the process stays small and forks in well under a
millisecond.

The **zygote** (one per backend) waits on socket FD for requests. A "spawn" request
starts bubblewrap itself (as the sandbox user, so the backend's own, larger process
never forks); bwrap builds the user, mount, net, ipc and uts namespaces and the
filesystem, then its child, the holder, blocks forever keeping them open. A "boot"
request carries the holder's pid and one end of a socketpair; for each::

    zygote ─fork─► C1: joins the sandbox's user, mount, net, ipc and uts namespaces and
                       its root directory, creates a pid namespace, forks, exits
                   └─► agent: pid 1 of that pid namespace, so it reaps every orphan and
                       no signal from inside can kill it; mounts its /proc; runs as the
                       sandbox's root with every capability dropped (bounding set too),
                       no_new_privs, not dumpable, a seccomp filter and the sandbox's
                       rlimits. It serves the socketpair.

No file of the agent exists inside the sandbox: it is a fork of a host process, so any
image works, with or without Python. It holds nothing the sandbox may not have: its
socket to the backend and its children.

The **agent** takes requests (JSON, with file descriptors by SCM_RIGHTS)::

    {"op": "exec", "id": N, "argv": [...], "env": {...}, "cwd": "/"}  + stdin, stdout,
                                                                        stderr, status fds
    {"op": "signal", "id": N, "sig": 15}   signal the command's process group
    {"op": "kill", "id": N}                kill the command's whole tree

and writes to each command's status pipe::

    S <pid>            started           E <errno> <message>   could not start
    X <exit code>      ended (-N: killed by signal N)           K   tree killed

A tree is the command's session, its descendants, and the orphans the agent adopted
while the command ran that belong to no other running command (daemons double-fork and
call setsid, so ancestry alone cannot find them). Killing the agent kills everything in
its pid namespace: that is how the backend ends a sandbox's processes.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

NS_GET_USERNS = 0xB701
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS = 0x40000000, 0x08000000, 0x04000000
PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 36, 38, 24
PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 28, 47, 4
PR_SET_DUMPABLE = 4
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
SECBIT_NOROOT_ALL = 0x3F  # noroot, no_setuid_fixup, keep_caps: each with its lock
CAPABILITY_VERSION_3 = 0x20080522
MAX_FDS = 8

libc = ctypes.CDLL(None, use_errno=True)
# resolved before forking, so children do not each look them up
_setns, _unshare, _prctl, _capset, _mount = (
    libc.setns, libc.unshare, libc.prctl, libc.capset, libc.mount)
CAP_LAST = int(open("/proc/sys/kernel/cap_last_cap").read())
CLK_TCK = os.sysconf("SC_CLK_TCK")
DEFAULT_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _recv(sock: socket.socket) -> tuple[bytes, list[int]]:
    msg, ancdata, _, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - len(data) % arr.itemsize])
            fds.extend(arr)
    return msg, fds


def _write(fd: int, line: str) -> None:
    try:
        os.write(fd, line.encode() + b"\n")
    except OSError:
        pass


# -- the zygote ---------------------------------------------------------------------------


def zygote(sock: socket.socket) -> None:
    if os.geteuid() == 0:
        os.setgroups([])
    # Orphaned agents (their C1 exits at once) are adopted here rather than by the host's
    # init, and reaped at once by the kernel: a sandbox's pid namespace can only finish
    # dying once every process in it has been reaped.
    _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    while True:
        try:
            msg, fds = _recv(sock)
        except InterruptedError:
            continue
        if not msg:
            return  # the backend went away: so do we
        req = json.loads(msg)
        if os.fork() == 0:
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if req.get("op") == "spawn":
                _spawn_bwrap(req, fds)
            try:
                _enter(req, fds[0])
            except BaseException as exc:  # report anything; never return into the loop
                try:
                    os.write(fds[0], f"E {exc}".encode())
                except OSError:
                    pass
            os._exit(1)
        for fd in fds:
            os.close(fd)


def _spawn_bwrap(req: dict[str, Any], fds: list[int]) -> None:
    """Exec bubblewrap as the sandbox user with its pipes at fixed numbers.

    fds: block pipe, info pipe → 3, 4 (the argv names them); stderr goes to the log file
    at req["log"]. The directories in req["mkdirs"] are made first, as that user."""
    try:
        block, info = fds
        for src, dest in ((block, 3), (info, 4)):
            os.dup2(src, dest)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.closerange(5, 65536)
        if req.get("nice"):
            os.nice(req["nice"])
        uid, gid = req.get("uid"), req.get("gid")
        if gid is not None:
            os.setresgid(gid, gid, gid)
        if uid is not None:
            os.setresuid(uid, uid, uid)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 2)
        os.close(log)
        for path in req.get("mkdirs", ()):
            os.mkdir(path, 0o755)
        os.execv(req["argv"][0], req["argv"])
    except BaseException as exc:
        try:
            os.write(2, f"rollbox zygote: cannot start bwrap: {exc}\n".encode())
        except OSError:
            pass
    os._exit(127)


def _enter(req: dict[str, Any], channel: int) -> None:
    """C1: join the sandbox, create its pid namespace, fork the agent as its init."""
    base = f"/proc/{req['holder']}"
    mnt = os.open(f"{base}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    others = [
        (os.open(f"{base}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC), flag, name)
        for name, flag in (("net", CLONE_NEWNET), ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS))
        # a shared (host) network namespace is ours already, and not the sandbox's to join
        if not os.path.samefile(f"{base}/ns/{name}", f"/proc/self/ns/{name}")
    ]
    root = os.open(f"{base}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    userns = fcntl.ioctl(mnt, NS_GET_USERNS)
    _check(_setns(userns, CLONE_NEWUSER), "setns user")
    _check(_setns(mnt, CLONE_NEWNS), "setns mnt")
    for fd, flag, name in others:
        _check(_setns(fd, flag), f"setns {name}")
    os.fchdir(root)
    os.chroot(".")
    for fd in [mnt, root, userns, *(fd for fd, _, _ in others)]:
        os.close(fd)
    _check(_unshare(CLONE_NEWPID), "unshare pid")
    agent = os.fork()
    if agent == 0:
        _become_agent(req, channel)
    os.write(channel, f"P {agent}".encode())  # its host pid: the backend watches and kills it
    os._exit(0)


# Syscalls no sandboxed program needs and kernel exploits love: keyrings, mounting, new
# namespaces, modules, kexec, bpf, perf, userfaultfd, io_uring, file handles, clocks.
# (x86_64, aarch64) numbers; anything else of another architecture is refused outright.
DENIED_SYSCALLS: dict[str, tuple[int, int | None]] = {
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "sethostname": (170, 161), "setdomainname": (171, 162),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "quotactl": (179, 60),
    "acct": (163, 89), "settimeofday": (164, 170), "adjtimex": (159, 171),
    "clock_settime": (227, 112), "clock_adjtime": (305, 266), "syslog": (103, 116),
    "vhangup": (153, 58), "unshare": (272, 97), "setns": (308, 268), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "lookup_dcookie": (212, 18), "kcmp": (312, 272),
    "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "iopl": (172, None), "ioperm": (173, None), "uselib": (134, None),
}
AUDIT_ARCH = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2


def _mount_proc() -> None:
    """A procfs of the new pid namespace over bwrap's: the sandbox sees only itself."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(_mount(b"proc", b"/proc", b"proc", flags, None), "mount /proc")


def _seccomp_filter() -> bytes | None:
    """A classic-BPF program denying DENIED_SYSCALLS with EPERM (None: unknown arch)."""
    machine = os.uname().machine
    if machine not in AUDIT_ARCH:
        return None
    arch, column = AUDIT_ARCH[machine]
    numbers = sorted({nr for pair in DENIED_SYSCALLS.values() if (nr := pair[column]) is not None})
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (ld, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI: same syscalls, other numbers
        prog.append((jge, 0, 1, 0x40000000))
        prog.append((ret, 0, 0, deny))
    for i, nr in enumerate(numbers):
        prog.append((jeq, len(numbers) - i, 0, nr))
    prog += [(ret, 0, 0, SECCOMP_RET_ALLOW), (ret, 0, 0, deny)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def _install_seccomp() -> None:
    program = _seccomp_filter()
    if program is None:
        return
    buf = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    _check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _become_agent(req: dict[str, Any], channel: int) -> None:
    """Pid 1 of the sandbox's pid namespace: signals from inside cannot kill it, and it
    is not dumpable, so nothing inside can ptrace it either."""
    _mount_proc()
    _prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.setsid()
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for kind, soft, hard in req["rlimits"]:
        try:
            resource.setrlimit(kind, (soft, hard))
        except (ValueError, OSError):
            pass
    for cap in range(CAP_LAST + 1):
        _prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAPABILITY_VERSION_3, 0)
    _check(_capset(header, (ctypes.c_uint32 * 6)()), "capset")
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _install_seccomp()
    os.chdir("/")
    os.closerange(3, channel)
    os.closerange(channel + 1, 65536)
    Agent(socket.socket(fileno=channel)).serve()
    os._exit(0)


# -- the agent ----------------------------------------------------------------------------


class Command:
    __slots__ = ("done", "pid", "started", "status")

    def __init__(self, pid: int, status: int, started: int) -> None:
        self.pid, self.status, self.started, self.done = pid, status, started, False


class Agent:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.commands: dict[int, Command] = {}  # by request id
        self.by_pid: dict[int, int] = {}
        self.killing: dict[int, Command] = {}
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        self.warm_up()
        self.sock.send(b"R")  # ready
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            try:
                events = poller.poll()
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 512)
                    except OSError:
                        pass
                    self.reap()
                elif not self.handle():
                    return

    def warm_up(self) -> None:
        """Walk the exec path once before the first request: a fresh fork pays its
        copy-on-write page faults here rather than inside the first command's latency."""
        req = json.loads(json.dumps({"op": "exec", "id": 0, "argv": ["/.rollbox-warm-up"],
                                     "env": {}, "cwd": "/"}))
        r, w = os.pipe2(os.O_CLOEXEC)
        try:
            self._spawn_in(req, [r, w, w])
        except OSError:
            pass
        finally:
            os.close(r)
            os.close(w)
        _processes()

    def handle(self) -> bool:
        try:
            msg, fds = _recv(self.sock)
        except InterruptedError:
            return True
        if not msg:
            return False
        req = json.loads(msg)
        op = req["op"]
        if op == "exec":
            self.spawn(req, fds)
        elif op == "signal":
            cmd = self.commands.get(req["id"])
            if cmd is not None and not cmd.done:
                try:
                    os.killpg(cmd.pid, req["sig"])
                except OSError:
                    pass
        elif op == "kill":
            cmd = self.commands.get(req["id"])
            if cmd is not None:
                self.kill_tree(cmd)
        return True

    def spawn(self, req: dict[str, Any], fds: list[int]) -> None:
        stdio, status = fds[:3], fds[3]
        # Not read from /proc/<pid>/stat after the spawn: that read waits until the
        # command's exec is done, and a slow exec would hold up this whole agent.
        started = _ticks_now()
        for fd in fds:
            os.set_inheritable(fd, False)
        try:
            pid = self._spawn_in(req, stdio)
        except OSError as exc:
            _write(status, f"E {exc.errno or 0} {req['argv'][0]}: {exc.strerror}")
            pid = -1
        for fd in stdio:
            os.close(fd)
        if pid < 0:
            os.close(status)
            return
        _write(status, f"S {pid}")
        cmd = Command(pid, status, started)
        self.commands[req["id"]] = cmd
        self.by_pid[pid] = req["id"]
        self.reap()

    def _spawn_in(self, req: dict[str, Any], stdio: list[int]) -> int:
        """posix_spawn takes no working directory: enter it around the spawn."""
        try:
            os.chdir(req["cwd"])
        except OSError as exc:
            raise OSError(exc.errno, f"cannot enter working directory {req['cwd']}: "
                          f"{exc.strerror}") from None
        try:
            return os.posix_spawnp(
                req["argv"][0], req["argv"], req["env"], setsid=True, setsigdef=DEFAULT_SIGNALS,
                file_actions=[(os.POSIX_SPAWN_DUP2, fd, i) for i, fd in enumerate(stdio)],
            )
        finally:
            os.chdir("/")

    def reap(self) -> None:
        while True:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            rid = self.by_pid.pop(pid, None)
            if rid is not None:
                cmd = self.commands[rid]
                cmd.done = True
                if rid not in self.killing:
                    _write(cmd.status, f"X {os.waitstatus_to_exitcode(wstatus)}")
                    os.close(cmd.status)
                    del self.commands[rid]
        for rid, cmd in list(self.killing.items()):
            if not self._tree(cmd):
                _write(cmd.status, "K")
                os.close(cmd.status)
                del self.killing[rid]
                self.commands.pop(rid, None)
            else:
                self._kill(cmd)

    def kill_tree(self, cmd: Command) -> None:
        rid = next(r for r, c in self.commands.items() if c is cmd)
        self.killing[rid] = cmd
        self._kill(cmd)
        self.reap()

    def _kill(self, cmd: Command) -> None:
        for pid in self._tree(cmd):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def _tree(self, cmd: Command) -> list[int]:
        """Live processes that belong to ``cmd`` (see the module docstring)."""
        me = os.getpid()
        others = {c.pid for c in self.commands.values() if c is not cmd and not c.done}
        procs = _processes()
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in procs.items():
            children.setdefault(ppid, []).append(pid)
        tree: set[int] = set()
        roots = [pid for pid, (ppid, sid, start) in procs.items()
                 if pid != me and (sid == cmd.pid or pid == cmd.pid or (
                     ppid == me and pid not in others and start >= cmd.started
                     and all(procs.get(o, (0, 0, 0))[1] != sid for o in others)))]
        while roots:
            pid = roots.pop()
            if pid in tree or pid == me or pid in others:
                continue
            tree.add(pid)
            roots.extend(children.get(pid, ()))
        return sorted(tree)


def _processes() -> dict[int, tuple[int, int, int]]:
    """pid → (ppid, session, start time in ticks) for every process in the sandbox."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat(int(name))
        if fields is not None:
            found[int(name)] = fields
    return found


def _stat(pid: int) -> tuple[int, int, int] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2:].split()
    if rest[0] == b"Z":
        return None
    return int(rest[1]), int(rest[3]), int(rest[19])


def _ticks_now() -> int:
    """Now, in the unit and from the origin of /proc/<pid>/stat's start time (clock ticks
    since boot): a process spawned after this call has a start time >= it."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLK_TCK)


if __name__ == "__main__":
    zygote(socket.socket(fileno=int(sys.argv[1])))
