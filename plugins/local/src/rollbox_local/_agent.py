"""The zygote and the in-sandbox agent: how commands and file operations get into a
sandbox fast, with nothing of the host's authority inside its reach.

This file runs as ``python -I -S _agent.py FD`` and imports nothing from rollbox or
outside the standard library, so the process stays small and forks in well under a
millisecond.

The **zygote** (one per backend, in a session of its own) waits on socket FD for
requests. A "spawn" request starts bubblewrap itself (as the sandbox user, so the
backend's own, larger process never forks); bwrap builds the user, mount, net, ipc and
uts namespaces and the filesystem, then its child, the holder, blocks forever keeping
them open. A "boot" request carries the holder's pid and one end of a socketpair; for
each::

    zygote ─fork─► C1: joins the sandbox's user, mount, net, ipc and uts namespaces and
                       its root directory, creates a pid namespace, forks, exits
                   └─► agent: pid 1 of that pid namespace, so no signal from inside can
                       kill it; mounts its /proc; runs as the sandbox's root with every
                       capability dropped (bounding set too), no_new_privs, not
                       dumpable, a seccomp filter and the sandbox's rlimits. It serves
                       the socketpair.

The **agent** never runs anything itself, and requests do not pass through it. It forks
**helpers** (forks of itself) and hands each one's socket to the backend, which keeps
the idle ones and sends each request straight to one: a request crosses one process
boundary, not two, and never waits for a fork unless every helper is busy. A helper
serves one request at a time and is a child subreaper: every process a command starts,
daemons that double-fork and call ``setsid`` included, stays in the helper's subtree
until it exits. That subtree is the command's tree — what a timeout kills, exactly, and
nothing of any other command. A helper that is killed from inside (a command may signal
its own helper: same uid) leaves strays to the agent, which kills them; one that is
stopped is continued at once (the agent is its parent and hears of the stop). Helpers and
the agent are not dumpable: a command cannot ptrace them or open their file descriptors
through /proc. Where the kernel has Landlock, each helper enters a Landlock domain of its
own as it is forked, and its commands inherit it: a process can then trace, read or write
the memory of, or take descriptors from, only processes of its own helper's domain. A
helper serves one request at a time and only once its subtree is empty, so two commands
alive at once are always in different domains: nothing a command leaves running can
reach a later command (a verdict's, say). The agent ignores every signal from inside
(it is the pid namespace's init and installs no handler a sandbox could reach).

Where the sandbox's memory is limited by a cgroup v1 group, the helpers (and so every
command) move into its ``work`` child group, which holds the limit; the agent stays in
the generation's group above it, so an out-of-memory kill of the workload never picks
the agent.

The agent's socket (JSON from the backend; every fd arrives close-on-exec)::

    {"op": "helper"}                 fork a helper: answered "H <pid>" + its socket,
                                     or "N <errno> <why>" (the sandbox's process limit)
    {"op": "cont", "pid": P}         SIGCONT helper P (its command may have stopped it)
    {"op": "slay", "pid": P}         SIGKILL helper P: its request's tree goes with it
                                     (a helper its own command keeps from killing it)
    {"op": "freeze"} / {"op": "thaw"} + status: stop / continue every process
    {"op": "seal"} + status          kill every process but the agent, helpers too
                                     (before a verdict: nothing of the workload lives on)

A helper's socket (a command starts with exactly fds 0, 1 and 2)::

    {"op": "exec", "id": N, "argv": [...], "env": {...}, "cwd": "/"}
                                      + stdin, stdout, stderr, status
    {"op": "read", "id": N, "path": P, "limit": L}           + data (write end), status
    {"op": "write", "id": N, "path": P, "mode": M}           + data (read end), status
    {"op": "connect", "id": N, "port": P}                    + reply (unix socket)
    {"op": "signal", "id": N, "sig": 15}   signal the command's process group
    {"op": "kill", "id": N}                kill the request's whole tree

and, from the helper, "warm" once it has warmed up (before its first request: the agent
waits for it at boot, the backend ignores it) and "idle" once a request is done and its
subtree empty.

Status lines (one request each; the helper writes them)::

    R              exec: received             S <pid>    exec: started
    X <n>          ended: exit code, or bytes moved
    E <errno> <m>  could not do it            K          tree killed (after "kill")
    T <kind>       not a regular file         F <size>   file over the limit

A connect request is answered on its reply socket: ``ok`` with the connected socket's
descriptor, or an ``E`` line. File operations run as the sandbox's own root, inside its
namespaces and root directory: a path resolves exactly as it would for a command, and
the host's privileges are never used on anything the sandbox controls.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import functools
import json
import os
import resource
import select
import signal
import socket
import stat
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
MS_REC, MS_PRIVATE = 0x4000, 0x40000
SECBIT_NOROOT_ALL = 0x3F  # noroot, no_setuid_fixup, keep_caps: each with its lock
CAPABILITY_VERSION_3 = 0x20080522
MAX_FDS = 8
CHUNK = 1 << 20
FREEZE_ROUNDS = 200

libc = ctypes.CDLL(None, use_errno=True)
# resolved before forking, so children do not each look them up
_setns, _unshare, _prctl, _capset, _mount = (
    libc.setns, libc.unshare, libc.prctl, libc.capset, libc.mount)
with open("/proc/sys/kernel/cap_last_cap") as _f:  # closed: the backend imports this too
    CAP_LAST = int(_f.read())
DEFAULT_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]
# Commands run at nice COMMAND_NICE: within their sandbox, the agent and its helpers (the
# kill of a timed-out tree, the next command's start) outweigh a busy command three to
# one, and a command cannot lower its nice value (that needs RLIMIT_NICE or CAP_SYS_NICE).
# Not SCHED_IDLE: a waking SCHED_IDLE task does not preempt a running one (it waits for
# the tick), and without cgroups it lost to a niced standby boot (the round trip of the
# command after a reset's first one: 5 ms instead of 3). Between sandboxes and against
# the host, the cgroup's weight decides (cgroups.py). glibc's posix_spawn takes no nice
# value, so it is set right after the spawn.
COMMAND_NICE = 5
HOLDER_POLL_S = 0.0002
"""How often C1 checks whether bwrap has finished (``_await_holder``): a read of a small
/proc file, cheap against the few milliseconds bwrap takes."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _recv(sock: socket.socket) -> tuple[bytes, list[int]]:
    """One message and its descriptors, which arrive close-on-exec (never inherited by
    a command unless handed to it on purpose)."""
    msg, ancdata, _, _ = sock.recvmsg(
        1 << 20, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC)
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


def _close(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
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
    _seccomp_filter()
    landlock_abi()
    while True:
        try:
            msg, fds = _recv(sock)
        except InterruptedError:
            continue
        except OSError:
            return
        if not msg:
            return  # the backend went away: so do we
        req = json.loads(msg)
        if os.fork() == 0:
            sock.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            if req.get("op") == "spawn":
                _spawn_bwrap(req, fds)
            if req.get("op") == "copy":
                _copy_layer(req, fds)
            try:
                _enter(req, fds[0])
            except BaseException as exc:  # report anything; never return into the loop
                try:
                    os.write(fds[0], f"E {exc}".encode())
                except OSError:
                    pass
            os._exit(1)
        _close(*fds)


def _spawn_bwrap(req: dict[str, Any], fds: list[int]) -> None:
    """Exec bubblewrap as the sandbox user with its pipes at fixed numbers.

    fds: block pipe, info pipe → 3, 4 (the argv names them); stderr goes to the log file
    at req["log"]. The directories in req["mkdirs"] are made first, as that user."""
    try:
        # Out of the way first (either may already sit at 3 or 4), then into place,
        # inheritable: bwrap gets exactly these.
        block, info = (fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 16) for fd in fds)
        for src, dest in ((block, 3), (info, 4)):
            os.dup2(src, dest, inheritable=True)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.closerange(5, 65536)
        failed = ""
        if req.get("cgroup"):
            try:
                _enter_cgroup(req["cgroup"])
            except OSError as exc:  # said in the log, once it is open
                failed = f"cannot set up the sandbox's cgroup: {exc}"
        if req.get("tmpfs") and not failed:
            try:
                _mount_layer(req["tmpfs"])
            except OSError as exc:
                failed = f"cannot mount the sandbox's writable layer: {exc}"
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
        if failed:
            raise OSError(failed)
        for path, mode in req.get("mkdirs", ()):
            os.mkdir(path, mode)
            os.chmod(path, mode)  # past the umask (/dev/shm is 1777)
        os.execv(req["argv"][0], req["argv"])
    except BaseException as exc:
        try:
            os.write(2, f"rollbox zygote: cannot start bwrap: {exc}\n".encode())
        except OSError:
            pass
    os._exit(127)


def _copy_layer(req: dict[str, Any], fds: list[int]) -> None:
    """Copy a sandbox's writable layer as the sandbox's own root: in its user namespace,
    so host files the sandbox could not touch stay untouchable, without following any
    symlink and with every directory opened relative to its parent (a sandbox racing
    the copy cannot steer it anywhere else). Answers X or E on the status fd."""
    status = fds[0]
    try:
        # The layer's directory first, with this process's own rights: it is reached
        # through directories the sandbox cannot change (a tmpfs layer only through the
        # bwrap process's root), and everything below it is read as the sandbox.
        src = os.open(req["src"], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        mnt = os.open(f"/proc/{req['holder']}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        userns = fcntl.ioctl(mnt, NS_GET_USERNS)
        _check(_setns(userns, CLONE_NEWUSER), "setns user")
        _close(mnt, userns)
        os.setresgid(0, 0, 0)  # the sandbox's root: what it creates, the sandbox owns
        os.setresuid(0, 0, 0)
        os.mkdir(req["dest"], 0o755)
        dest = os.open(req["dest"], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        copy_tree(src, dest)
        _write(status, "X 0")
    except OSError as exc:
        _write(status, f"E {exc.errno or 0} {exc.strerror}: {exc.filename or req.get('src')}")
    except BaseException as exc:
        _write(status, f"E 0 {exc!r}")
    os._exit(0)


def copy_tree(src: int, dest: int) -> None:
    """Copy the directory open at ``src`` into the empty directory open at ``dest``:
    directories, regular files, symlinks (as links) and whiteouts (0/0 devices), with
    modes, times and user.* xattrs (overlayfs keeps its markers there in a user
    namespace). FIFOs and sockets do not survive. Takes both descriptors."""
    stack = [(src, dest, sorted(os.listdir(src)))]
    while stack:
        sfd, dfd, names = stack[-1]
        if not names:
            stack.pop()
            _copy_meta(sfd, dfd)
            _close(sfd, dfd)
            continue
        name = names.pop()
        st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            sub = _open_same(name, sfd, st, os.O_RDONLY | os.O_DIRECTORY)
            os.mkdir(name, 0o700, dir_fd=dfd)
            dsub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                           dir_fd=dfd)
            stack.append((sub, dsub, sorted(os.listdir(sub))))
        elif stat.S_ISREG(st.st_mode):
            source = _open_same(name, sfd, st, os.O_RDONLY | os.O_NONBLOCK)
            try:
                target = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=dfd)
                try:
                    _copy_bytes(source, target, st.st_size)
                    _copy_meta(source, target)
                finally:
                    os.close(target)
            finally:
                os.close(source)
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(name, dir_fd=sfd), name, dir_fd=dfd)
            os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dfd,
                     follow_symlinks=False)
        elif stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # an overlay whiteout
            os.mknod(name, stat.S_IFCHR | 0o000, 0, dir_fd=dfd)


def _open_same(name: str, dir_fd: int, st: os.stat_result, flags: int) -> int:
    """Open ``name`` without following a symlink, and only if it is still the file
    ``st`` describes (a sandbox swapping entries around gets an error, not a detour)."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise OSError(errno.ESTALE, "changed while being copied", name)
    return fd


def _copy_bytes(source: int, target: int, size: int) -> None:
    """copy_file_range where both sides share a filesystem (a reflink where it can),
    sendfile across filesystems (a layer in memory, its snapshot on disk)."""
    copied = 0
    same_fs = True
    while copied < size:
        count = min(size - copied, 1 << 30)
        if same_fs:
            try:
                moved = os.copy_file_range(source, target, count)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                same_fs = False
                continue
        else:
            moved = os.sendfile(target, source, copied, count)
        if moved == 0:
            break
        copied += moved


def _copy_meta(source: int, target: int) -> None:
    """Mode, user.* xattrs and times from one open file to another."""
    st = os.fstat(source)
    for key in os.listxattr(source):
        if key.startswith("user."):
            os.setxattr(target, key, os.getxattr(source, key))
    os.fchmod(target, stat.S_IMODE(st.st_mode))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


def _mount_layer(spec: dict[str, Any]) -> None:
    """A tmpfs of its own for a generation's writable layer, in a mount namespace of
    its own (bwrap starts in it): ``size`` and ``nr_inodes`` bound what the sandbox can
    write, and the memory goes back when the last process of the generation ends, with
    nothing to delete. Unprivileged, the mount namespace needs a user namespace of its
    own (mapping this user to itself); bwrap's then nests inside it."""
    uid, gid = os.getuid(), os.getgid()
    if os.geteuid() == 0:
        _check(_unshare(CLONE_NEWNS), "unshare mount namespace")
    else:
        _check(_unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare user+mount namespace")
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    _check(_mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "make mounts private")
    path = spec["path"]
    os.mkdir(path, 0o755)
    owner = spec.get("owner") or [uid, gid]
    options = (f"size={spec['size']},nr_inodes={spec['inodes']},mode=0755,"
               f"uid={owner[0]},gid={owner[1]}")
    _check(_mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()),
           f"mount a tmpfs on {path}")


def _enter_cgroup(plan: dict[str, Any]) -> None:
    """Make a generation's cgroup, write its limits, move this process into it (see
    ``cgroups.py``): what this process starts, the sandbox, runs under those limits."""
    for path in plan["dirs"]:
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass
    for path, value in plan["writes"]:
        with open(path, "w") as f:
            f.write(value)
    _join_cgroup(plan["procs"])


def _join_cgroup(procs: list[str]) -> None:
    """Move this (single-threaded) process: ``0`` is the writer itself (see JOIN_V1 in
    cgroups.py for why a v1 group is entered through ``tasks``)."""
    for path in procs:
        with open(path, "w") as f:
            f.write("0")


def _enter(req: dict[str, Any], channel: int) -> None:
    """C1: join the sandbox, create its pid namespace, fork the agent as its init."""
    if req.get("cgroup_procs"):  # before leaving the host's mount namespace
        _join_cgroup(req["cgroup_procs"])
    # The workload's group, opened here (the sandbox has no cgroup filesystem): each
    # helper writes itself into it as it is forked (v1 ``tasks``: see cgroups.py).
    work = [os.open(path, os.O_WRONLY | os.O_CLOEXEC) for path in req.get("workload_cgroup", ())]
    if req.get("await_holder"):
        _await_holder(req["holder"], req["await_holder"])
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
    _close(mnt, root, userns, *(fd for fd, _, _ in others))
    _check(_unshare(CLONE_NEWPID), "unshare pid")
    agent = os.fork()
    if agent == 0:
        _become_agent(req, channel, work)
    os.write(channel, f"P {agent}".encode())  # its host pid: the backend watches and kills it
    os._exit(0)


def caps_dropped(pid: int) -> bool | None:
    """Whether ``pid`` has dropped every capability; None if it no longer exists.

    bwrap's child, the holder, drops them as its last step of setting the sandbox up,
    right before it blocks: the sandbox is ready then (also used by ``instance.py``)."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
        try:
            status = os.read(fd, 16384)
        finally:
            os.close(fd)
    except OSError:
        return None
    at = status.find(b"\nCapEff:")
    if at < 0:
        return False
    end = status.find(b"\n", at + 1)
    return int(status[at + 8:end if end > 0 else None], 16) == 0


def _await_holder(holder: int, timeout: float) -> None:
    """Wait until bwrap has set the sandbox up (``caps_dropped``): when the agent is
    booted with its sandbox, this is checked here, off the backend's event loop and
    within HOLDER_POLL_S of it happening."""
    deadline = time.monotonic() + timeout
    while not (ready := caps_dropped(holder)):
        if ready is None:
            raise OSError(errno.ESRCH, "bwrap exited before the sandbox was set up")
        if time.monotonic() > deadline:
            raise OSError(errno.ETIMEDOUT, "bwrap did not set the sandbox up in time")
        time.sleep(HOLDER_POLL_S)


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
# socket() and socketpair() may only make these families: local sockets, IP (which
# reaches only the sandbox's own loopback unless its spec shares the host's network),
# and netlink (route queries within its own network namespace). No AF_VSOCK to the
# hypervisor, no AF_PACKET, AF_ALG, AF_BLUETOOTH … (kernel attack surface, other paths out).
SOCKET_SYSCALLS: dict[str, tuple[int, int]] = {"socket": (41, 198), "socketpair": (53, 199)}
ALLOWED_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
AUDIT_ARCH = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
BPF_LD_W_ABS, BPF_JEQ_K, BPF_JGE_K, BPF_RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_NR, SECCOMP_ARCH, SECCOMP_ARG0 = 0, 4, 16  # offsets in struct seccomp_data (LE)


def _mount_proc() -> None:
    """A procfs of the new pid namespace over bwrap's: the sandbox sees only itself."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(_mount(b"proc", b"/proc", b"proc", flags, None), "mount /proc")


@functools.cache  # built by the zygote before it forks (70 µs an agent boot otherwise)
def _seccomp_filter() -> bytes | None:
    """A classic-BPF program: DENIED_SYSCALLS fail with EPERM, sockets of any family
    outside ALLOWED_FAMILIES with EAFNOSUPPORT (None: an unknown architecture)."""
    machine = os.uname().machine
    if machine not in AUDIT_ARCH:
        return None
    arch, column = AUDIT_ARCH[machine]
    denied = sorted({nr for pair in DENIED_SYSCALLS.values() if (nr := pair[column]) is not None})
    sockets = [pair[column] for pair in SOCKET_SYSCALLS.values()]
    deny = SECCOMP_RET_ERRNO | errno.EPERM
    no_family = SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT
    # Instructions as (code, jump-if-true label, jump-if-false label, k); labels resolve
    # to relative offsets below. None = fall through to the next instruction.
    prog: list[tuple[int, str | None, str | None, int]] = [
        (BPF_LD_W_ABS, None, None, SECCOMP_ARCH), (BPF_JEQ_K, None, "deny", arch),
        (BPF_LD_W_ABS, None, None, SECCOMP_NR),
    ]
    if machine == "x86_64":  # the x32 ABI: same syscalls, other numbers
        prog.append((BPF_JGE_K, "deny", None, 0x40000000))
    prog += [(BPF_JEQ_K, "family", None, nr) for nr in sockets]
    prog += [(BPF_JEQ_K, "deny", None, nr) for nr in denied]
    prog.append((BPF_RET_K, None, None, SECCOMP_RET_ALLOW))
    labels = {"family": len(prog)}
    prog.append((BPF_LD_W_ABS, None, None, SECCOMP_ARG0))
    prog += [(BPF_JEQ_K, "allow", None, family) for family in ALLOWED_FAMILIES]
    prog.append((BPF_RET_K, None, None, no_family))
    labels["allow"] = len(prog)
    prog.append((BPF_RET_K, None, None, SECCOMP_RET_ALLOW))
    labels["deny"] = len(prog)
    prog.append((BPF_RET_K, None, None, deny))

    def offset(at: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - at - 1

    return b"".join(struct.pack("HBBI", code, offset(i, jt), offset(i, jf), k)
                    for i, (code, jt, jf, k) in enumerate(prog))


def _install_seccomp() -> None:
    program = _seccomp_filter()
    if program is None:
        return
    buf = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.addressof(buf))
    _check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _become_agent(req: dict[str, Any], channel: int, work: list[int]) -> None:
    """Pid 1 of the sandbox's pid namespace: signals from inside cannot kill it (the
    kernel drops those an init has no handler for, and SIGINT, the one Python handles,
    is ignored), and it is not dumpable, so nothing inside can ptrace it either."""
    _mount_proc()
    _prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.setsid()
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
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
    _close_all_but(channel, *work)
    os.set_inheritable(channel, False)
    Agent(socket.socket(fileno=channel), work, isolate=req.get("isolate", True)).serve()
    os._exit(0)


def _close_all_but(*keep: int) -> None:
    """Close every descriptor from 3 up but ``keep``."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)


# Landlock (Linux >= 5.13): a domain restricts what its processes may do to processes
# outside it. A ruleset must handle some access right: making block devices, which a
# sandbox (no CAP_MKNOD) can never do anyway, so the domain restricts nothing else.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_RESTRICT_SELF = 444, 446  # x86_64 and aarch64
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_ACCESS_FS_MAKE_BLOCK = 1 << 11


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (or it is disabled)."""
    if os.uname().machine not in AUDIT_ARCH:
        return 0
    version = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _enter_landlock_domain() -> bool:
    """Put this process (a fresh helper) in a Landlock domain of its own; False where
    the kernel has no Landlock. Needs no_new_privs (the agent set it)."""
    if not landlock_abi():
        return False
    handled = ctypes.c_uint64(LANDLOCK_ACCESS_FS_MAKE_BLOCK)
    ruleset = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(handled),
                           ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        return False
    try:
        return int(libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset),
                                ctypes.c_uint32(0))) == 0
    finally:
        os.close(ruleset)


# -- the agent ----------------------------------------------------------------------------

FORWARDED = ("exec", "read", "write", "connect")
"""What a helper serves (sent to it by the backend, never through the agent)."""


class Agent:
    """Pid 1 of the sandbox: forks helpers and hands their sockets to the backend,
    which sends requests straight to them (one process boundary per request, not two);
    continues a helper that its own command stopped; reaps, and kills the strays a
    helper killed from inside leaves behind; freezes the sandbox for a snapshot."""

    def __init__(self, sock: socket.socket, work: list[int] | None = None, *,
                 isolate: bool = True) -> None:
        self.sock = sock
        self.work = work or []  # the workload's cgroup: helpers enter it (see _enter)
        self.isolate = isolate  # each helper in a Landlock domain of its own
        self.helpers: set[int] = set()
        self.purge = False  # a helper died from a signal: kill the strays it left
        self.poller = select.poll()
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def serve(self) -> None:
        self.give_helper(warm=True)
        self.sock.send(b"R")  # ready
        self.poller.register(self.sock.fileno(), select.POLLIN)
        self.poller.register(self.wake_r, select.POLLIN)
        while True:
            try:
                events = self.poller.poll()
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

    def give_helper(self, *, warm: bool = False) -> None:
        """Fork a helper and send the backend its socket ("H <pid>"), or say why not
        ("N <errno> <why>": the sandbox is at its process limit).

        ``warm``: first wait (up to WARM_WAIT_MS) for the helper's "warm": at boot, so
        that the agent says ready only once its first helper has warmed up, and the
        sandbox's first command does not wait behind the warm-up (a standby boots at a
        low CPU weight: a first command sent early waited ~1 ms for it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError as exc:
            ours.close()
            theirs.close()
            _send_quietly(self.sock, f"N {exc.errno or 0} {exc.strerror}".encode())
            return
        if pid == 0:  # keep nothing of the agent's: its socket, other requests' pipes
            for fd in self.work:
                try:
                    os.write(fd, b"0")
                except OSError:
                    pass  # the limit still holds for the group above
            _close_all_but(theirs.fileno())
            if self.isolate:
                _enter_landlock_domain()
            Helper(theirs).serve()
            os._exit(0)
        theirs.close()
        self.helpers.add(pid)
        if warm and select.select([ours], [], [], WARM_WAIT_MS / 1000)[0]:
            try:
                ours.recv(16)  # "warm" (or b"": it died, and the backend will see that)
            except OSError:
                pass
        _send_quietly(self.sock, f"H {pid}".encode(), [ours.fileno()])
        ours.close()

    def handle(self) -> bool:
        try:
            msg, fds = _recv(self.sock)
        except InterruptedError:
            return True
        if not msg:
            return False
        _close(*fds[1:])
        try:
            req = json.loads(msg)
            op = req["op"]
        except (ValueError, KeyError, TypeError):
            _close(*fds[:1])
            return True
        helper = req.get("pid") if req.get("pid") in self.helpers else None
        if op == "helper":
            self.give_helper()
        elif op == "cont" and helper is not None:
            _signal(helper, signal.SIGCONT)  # a command may have stopped its helper
        elif op == "slay" and helper is not None:
            _signal(helper, signal.SIGKILL)  # its tree: strays, killed once it is reaped
        elif op in ("freeze", "thaw") and fds:
            ok = freeze(op == "freeze")
            _write(fds[0], "X 0" if ok else f"E {errno.EBUSY} its processes would not stop")
        elif op == "seal" and fds:
            killed = self.seal()
            _write(fds[0], f"X {killed}" if killed >= 0
                   else f"E {errno.EBUSY} its processes would not die")
        _close(*fds[:1])
        return True

    def seal(self) -> int:
        """Kill every process of the sandbox but this one, helpers included, and reap
        them all; the number killed, or -1 if some would not die in SEAL_WAIT_S.

        ``kill(-1)`` from a pid namespace's init reaches every other process in it, and
        a process forking meanwhile cannot escape: its child exists when the signal is
        sent (and gets it too), or its fork fails on the pending SIGKILL."""
        me = os.getpid()
        victims = len(_processes()) - 1
        _signal(-1, signal.SIGKILL)
        deadline = time.monotonic() + SEAL_WAIT_S
        while True:
            while True:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
            if list(_processes()) == [me]:
                break
            if time.monotonic() > deadline:
                return -1
            time.sleep(0.0005)
        self.helpers.clear()
        self.purge = False
        return victims

    def reap(self) -> None:
        while True:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG | os.WUNTRACED)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid not in self.helpers:
                continue  # a stray, adopted after its helper died
            if os.WIFSTOPPED(wstatus):  # by a command of the sandbox: it must serve
                _signal(pid, signal.SIGCONT)
                continue
            self.helpers.discard(pid)
            if os.WIFSIGNALED(wstatus):
                self.purge = True
        if self.purge:
            strays = _strays(self.helpers)
            for pid in strays:
                _signal(pid, signal.SIGKILL)
            self.purge = bool(strays)


def _send_quietly(sock: socket.socket, msg: bytes, fds: list[int] | None = None) -> None:
    """To the backend; if it is gone, the sandbox is being torn down anyway."""
    try:
        sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                              array.array("i", fds).tobytes())] if fds else [])
    except OSError:
        pass


def freeze(stop: bool) -> bool:
    """Stop (or continue) every process of the sandbox but this one, until none runs.

    A process in uninterruptible sleep ("D": a vfork parent whose child was just
    stopped, a syscall in the kernel) counts as stopped once it has been sent SIGSTOP:
    it stops before it returns to user space."""
    me = os.getpid()
    signalled: set[int] = set()
    for _ in range(FREEZE_ROUNDS):
        procs = _processes()
        settled = "TtZXD" if stop else ""
        targets = [pid for pid, (_, state) in procs.items() if pid != me and not (
            state in settled and (state != "D" or pid in signalled))]
        if not targets:
            return True
        for pid in targets:
            _signal(pid, signal.SIGSTOP if stop else signal.SIGCONT)
        if not stop:
            return True
        signalled.update(targets)
        time.sleep(0.0005)
    return False


def _rehearsal_fds() -> list[int]:
    """Stand-ins for an exec request's stdin, stdout, stderr and status."""
    stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    return [stdin_r, stdin_w, out_r, out_w]


def _send_rehearsal(sock: socket.socket, fds: list[int]) -> None:
    """An exec request of ``WARM_UP_PATH`` on ``sock``, with ``fds`` as its stdio."""
    request = {"op": "exec", "id": REHEARSAL, "argv": [WARM_UP_PATH], "env": {}, "cwd": "/"}
    stdio = [fds[0], fds[3], fds[3], fds[3]]  # stdin; stdout, stderr, status: one pipe
    sock.sendmsg([json.dumps(request).encode()],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", stdio).tobytes())])


REHEARSAL = -1
"""The id of a helper's own stand-in request (``Helper.warm_up``)."""
WARM_UP_PATH = "/.rollbox-warm-up"
"""Run by each helper's warm-up: a path no image has (it fails)."""
WARM_WAIT_MS = 1000
SEAL_WAIT_S = 5.0
"""How long ``Agent.seal`` waits for the killed processes to be gone (a process in
uninterruptible sleep dies only when its system call returns)."""
"""How long the agent waits at boot for its first helper to warm up (see give_helper)."""


# -- helpers: one request at a time ------------------------------------------------------------


class Helper:
    """A fork of the agent that serves requests one at a time (see the module
    docstring)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        signal.set_wakeup_fd(-1)  # the agent's wake-up pipe (closed with the rest)
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        _prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def serve(self) -> None:
        """Serve requests one at a time until the backend closes the socket. After
        each, the helper's subtree is empty (a command's daemons are waited for or
        killed) and it tells the backend it is idle again."""
        self.warm_up()
        try:
            self.sock.send(b"warm")  # the agent waits for it at boot; the backend ignores it
        except OSError:
            return
        while True:
            try:
                msg, fds = _recv(self.sock)
                req = json.loads(msg) if msg else None
            except InterruptedError:
                continue
            except (OSError, ValueError):
                return
            if msg == b"":
                return
            if not isinstance(req, dict) or req.get("op") not in FORWARDED:
                _close(*fds)  # a late order for a request already done
                continue
            self.handle(req, fds)
            try:
                self.sock.send(b"idle")
            except OSError:
                return

    def handle(self, req: dict[str, Any], fds: list[int]) -> None:
        op = req.get("op")
        try:
            if op == "exec":
                self.exec(req, fds)
            elif op == "read":
                read_file(req, fds)
            elif op == "write":
                write_file(req, fds)
            elif op == "connect":
                connect(req, fds)
        except (KeyError, TypeError, ValueError, IndexError):
            _close(*fds)  # a malformed request from the backend: nothing to answer on

    def warm_up(self) -> None:
        """Walk the request path once before serving, on a stand-in request (received
        from a socket pair, parsed, its spawn failing, its status written, its watch
        ending at once): a fresh fork pays its copy-on-write page faults here rather
        than inside the first command's latency."""
        orders, requests = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        fds = _rehearsal_fds()
        try:
            _send_rehearsal(orders, fds)
            msg, received = _recv(requests)
            self.handle(json.loads(msg), received)  # closes what it received
            self.watch(REHEARSAL, 0, fds[-1])  # no child: returns at once
        except (OSError, ValueError):
            pass
        finally:
            orders.close()
            requests.close()
            _close(*fds)

    def exec(self, req: dict[str, Any], fds: list[int]) -> None:
        stdio, status = fds[:3], fds[3]
        try:
            # Before anything runs: a request whose status ends without this line was
            # never taken up (sent to a helper a command had just killed), and the
            # backend may send it again without running anything twice.
            _write(status, "R")
            try:
                pid = _spawn(req, stdio)
            except OSError as exc:
                _write(status, f"E {exc.errno or 0} {req['argv'][0]}: {exc.strerror}")
                return
            finally:
                _close(*stdio)
            try:
                os.setpriority(os.PRIO_PROCESS, pid, COMMAND_NICE)
            except OSError:
                pass  # it has already ended
            _write(status, f"S {pid}")
            self.watch(req["id"], pid, status)
        finally:
            _close(status)

    def watch(self, rid: int, pid: int, status: int) -> None:
        """Until this helper's subtree is empty: report the command's end, take the
        backend's orders for this request (signal its group, kill the whole tree)."""
        killing, running = False, True
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        poller.register(self.wake_r, select.POLLIN)
        while True:
            while True:  # reap whatever has ended; the command's own end is reported
                try:
                    child, wstatus = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    if killing:
                        _write(status, "K")
                    return  # nothing left in this command's tree
                if child == 0:
                    break
                if child == pid and running:
                    running = False
                    if not killing:
                        _write(status, f"X {os.waitstatus_to_exitcode(wstatus)}")
            if killing:
                for victim in _descendants(os.getpid()):
                    _signal(victim, signal.SIGKILL)
            try:
                events = poller.poll(100 if killing else None)
            except InterruptedError:
                continue
            for fd, _ in events:
                if fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 512)
                    except OSError:
                        pass
                    continue
                try:
                    msg = self.sock.recv(4096)
                    order = json.loads(msg) if msg else None
                except (OSError, ValueError):
                    order = None
                if not isinstance(order, dict):
                    poller.unregister(self.sock.fileno())  # the backend is gone
                elif order.get("id") != rid:
                    continue  # late, for an earlier request
                elif order.get("op") == "kill":
                    killing = True
                elif order.get("op") == "signal" and running:
                    _signal(-pid, int(order.get("sig", 0)))


def _spawn(req: dict[str, Any], stdio: list[int]) -> int:
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


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def read_file(req: dict[str, Any], fds: list[int]) -> None:
    """Send a regular file's bytes down the data pipe; never open anything that blocks
    (a FIFO opens non-blocking and is refused), never send more than the limit."""
    data, status = fds
    try:
        _write(status, _send_file(req["path"], int(req["limit"]), data))
    finally:
        _close(data, status)


def _send_file(path: str, limit: int, data: int) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        return f"E {exc.errno} {exc.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"T {_file_kind(st.st_mode)}"
        if st.st_size > limit:
            return f"F {st.st_size}"
        os.set_blocking(fd, True)
        sent = 0
        while chunk := os.read(fd, CHUNK):
            sent += len(chunk)
            if sent > limit:  # it grew, or a /proc file with no size
                return f"F {sent}"
            _write_all(data, chunk)
        return f"X {sent}"
    except OSError as exc:
        return f"E {exc.errno} {exc.strerror}"
    finally:
        _close(fd)


def write_file(req: dict[str, Any], fds: list[int]) -> None:
    """Create or replace a regular file from the data pipe's bytes (parents made)."""
    data, status = fds
    try:
        _write(status, _receive_file(req["path"], int(req["mode"]) & 0o7777, data))
    finally:
        _close(data, status)


def _receive_file(path: str, mode: int, data: int) -> str:
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over RLIMIT_FSIZE: EFBIG
    fd = -1
    try:
        parent = os.path.dirname(path)
        if parent:
            try:
                os.makedirs(parent, 0o755, exist_ok=True)
            except FileExistsError:  # a file, or a symlink to nowhere, where a dir should be
                raise OSError(errno.ENOTDIR, f"{parent} is not a directory") from None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, mode)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return f"T {_file_kind(st.st_mode)}"
        os.set_blocking(fd, True)
        os.fchmod(fd, mode)
        written = 0
        while chunk := os.read(data, CHUNK):
            _write_all(fd, chunk)
            written += len(chunk)
        return f"X {written}"
    except OSError as exc:
        return f"E {exc.errno} {exc.strerror}"
    finally:
        signal.signal(signal.SIGXFSZ, previous)
        if fd >= 0:
            _close(fd)


def _write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view):]


def connect(req: dict[str, Any], fds: list[int]) -> None:
    """Connect to ``port`` on the sandbox's own loopback and pass the socket back."""
    reply = socket.socket(fileno=fds[0])
    port = int(req["port"])
    error: OSError = OSError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        conn = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        conn.settimeout(10)
        try:
            conn.connect((address, port))
            if conn.getsockname() == conn.getpeername():
                # Nothing listens, and the kernel gave this socket PORT itself as its
                # ephemeral port: TCP's simultaneous open connected it to itself.
                raise OSError(errno.ECONNREFUSED, os.strerror(errno.ECONNREFUSED))
        except OSError as exc:
            error = exc
            conn.close()
            continue
        try:
            reply.sendmsg([b"ok"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                     array.array("i", [conn.fileno()]).tobytes())])
        except OSError:
            pass
        conn.close()
        reply.close()
        return
    try:
        reply.send(f"E {error.errno or 0} {error.strerror}".encode())
    except OSError:
        pass
    reply.close()


# -- process table (of the sandbox's pid namespace) ----------------------------------------


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def _processes() -> dict[int, tuple[int, str]]:
    """pid → (ppid, state letter) for every process in the sandbox."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rindex(b")") + 2:].split()
        found[int(name)] = (int(rest[1]), rest[0].decode())
    return found


def _tree(procs: dict[int, tuple[int, str]], roots: list[int]) -> list[int]:
    """``roots`` and every process below them, zombies left out."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if procs.get(pid, (0, "X"))[1] not in ("Z", "X"):
            found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _descendants(root: int) -> list[int]:
    """Every live process below ``root`` (not ``root`` itself)."""
    procs = _processes()
    return [pid for pid in _tree(procs, [root]) if pid != root]


def _strays(helpers: set[int]) -> list[int]:
    """Processes of the sandbox that no helper owns: adopted by the agent after the
    helper above them was killed (only a command can have done that)."""
    procs = _processes()
    me = os.getpid()
    owned = set(_tree(procs, sorted(helpers)))
    roots = [pid for pid, (ppid, _) in procs.items() if ppid == me and pid not in helpers]
    return [pid for pid in _tree(procs, roots) if pid not in owned and pid != me]


if __name__ == "__main__":
    try:
        zygote(socket.socket(fileno=int(sys.argv[1])))
    except KeyboardInterrupt:
        pass
