"""The guest sandbox: Debian's bubblewrap (``bwrap``), as Flatpak uses it.

``argv`` builds the command line from a ``SandboxPolicy`` and a ``HostView`` (what of the host
the guest may see); it is pure, so the rules below are unit-tested without starting anything.
``host_view``, ``new_userns``, ``probe`` and ``make_non_dumpable`` are the I/O around it.

A sandboxed guest gets
- new user, PID, mount, IPC, UTS and cgroup namespaces, and a new network namespace (no network,
  not even loopback to the node) unless the policy allows egress;
- a root of its own: the interpreter, the venv, the app's code and ``sys.path`` read-only, a
  private ``/tmp`` (tmpfs, size-capped) as its only writable place, its own ``/proc`` and
  ``/dev``; the agent's home and log directory are hidden under empty tmpfs mounts;
- an environment of a few names (``guest_env``): no credentials, no ``CONVEYOR_*``;
- the socketpair to its agent and its log file as inherited descriptors (bwrap keeps them);
- rlimits set by the stub before user code loads (``conveyor.agents.guest``).

Which user it runs as depends on the agent's own user:
- an unprivileged agent: ``--unshare-user --uid U --gid G``. Inside, the guest is ``U``; outside,
  the kernel sees the agent's user (an unprivileged user cannot map any other). The PID namespace
  hides the agent's processes and the agent is non-dumpable, so this does not expose it. Process
  counts are kept per user namespace, so RLIMIT_NPROC bounds each guest on its own.
- a root agent (a container, CI): root's processes are exempt from RLIMIT_NPROC, so the guest
  must not be root outside. The agent makes a user namespace that maps ``U`` to ``U`` (and root
  to root, for bwrap's set-up only), bwrap joins it (``--userns``) keeping only CAP_SETUID and
  CAP_SETGID, and the stub switches to ``U:G`` (``--drop-to``) before anything else: the guest
  is then really another user, without capabilities, and the fork bound holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

BWRAP = "/usr/bin/bwrap"
INSTALL_HINT = "install it with `sudo apt-get install bubblewrap`"
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"  # util-linux
USERNS_WAIT_S = 10.0
USERNS_TRIES = 3
PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
# System directories a Debian interpreter needs; a symlink (merged /usr) stays a symlink.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group")
NET_ETC_FILES = (
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
)
PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ")
SCRATCH = "/tmp"


class SandboxUnavailable(Exception):
    """bwrap was asked for but is missing or cannot start a guest here."""


@dataclass(frozen=True, kw_only=True)
class SandboxPolicy:
    """How guests are confined. The limits are per guest process; 0 or None: no limit."""

    uid: int = 65534  # nobody
    gid: int = 65534  # nogroup
    allow_net: bool = False  # share the host's network (any host: bwrap cannot filter)
    memory_mb: int | None = 2048  # RLIMIT_AS (address space, not resident memory)
    processes: int = 128  # RLIMIT_NPROC: processes and threads of the guest's user
    file_mb: int = 1024  # RLIMIT_FSIZE: the largest file it may write (its log file too)
    tmp_mb: int = 256  # the size of its private /tmp
    bwrap: str = BWRAP


@dataclass(frozen=True, kw_only=True)
class HostView:
    """What of the host a guest sees: read-only directories, symlinks, optional /etc files,
    and paths masked by an empty tmpfs."""

    binds: tuple[str, ...]
    links: tuple[tuple[str, str], ...] = ()
    etc: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    cwd: str = "/"


def argv(
    policy: SandboxPolicy,
    view: HostView,
    command: list[str],
    env: Mapping[str, str],
    *,
    userns_fd: int | None = None,
) -> list[str]:
    """The bwrap command line running ``command`` under ``policy``. ``userns_fd``: a user
    namespace made by ``new_userns`` (a root agent); None: bwrap makes one (``--uid``)."""
    args = [policy.bwrap, *_namespaces(policy, userns_fd), "--die-with-parent", "--new-session"]
    # Sticky and writable by all, as a host's /tmp: the guest's user does not own it.
    args += ["--perms", "1777", "--size", str(policy.tmp_mb * 1024 * 1024), "--tmpfs", SCRATCH]
    made: set[str] = {"/", SCRATCH}
    for path, target in view.links:
        args += [*_parents(path, made), "--symlink", target, path]
    for path in view.binds:
        args += [*_parents(path, made), "--ro-bind", path, path]
    for path in view.etc:
        args += [*_parents(path, made), "--ro-bind-try", path, path]
    for path in view.hidden:
        args += ["--tmpfs", path]
    args += ["--proc", "/proc", "--dev", "/dev", "--chdir", view.cwd, "--clearenv"]
    for name, value in sorted(env.items()):
        args += ["--setenv", name, value]
    return [*args, "--", *command]


def _namespaces(policy: SandboxPolicy, userns_fd: int | None) -> list[str]:
    if userns_fd is None:
        args = ["--unshare-all", "--unshare-cgroup-try"]
        if policy.allow_net:
            args.append("--share-net")
        return [*args, "--uid", str(policy.uid), "--gid", str(policy.gid)]
    args = ["--userns", str(userns_fd), "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args.append("--unshare-cgroup-try")
    if not policy.allow_net:
        args.append("--unshare-net")
    # Only for the stub's switch to the guest's user; it has no capability after that.
    return [*args, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]


def _parents(path: str, made: set[str]) -> list[str]:
    """``--dir`` for each missing parent of ``path``, traversable (bwrap's default for a root
    agent is 0700, which the guest's user could not enter)."""
    args: list[str] = []
    for parent in reversed(PurePosixPath(path).parents):
        name = str(parent)
        if name not in made:
            made.add(name)
            args += ["--perms", "0755", "--dir", name]
    made.add(path)
    return args


def guest_args(policy: SandboxPolicy, *, privileged: bool) -> list[str]:
    """The stub's arguments for the limits it sets before user code loads."""
    args = ["--processes", str(policy.processes), "--file-mb", str(policy.file_mb)]
    if privileged:
        args += ["--drop-to", f"{policy.uid}:{policy.gid}"]
    return args


def guest_env(environ: Mapping[str, str], pythonpath: Iterable[str]) -> dict[str, str]:
    """The whole environment of a sandboxed guest: a few harmless names, never a credential."""
    env = {name: environ[name] for name in PASSED_ENV if name in environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=SCRATCH, TMPDIR=SCRATCH, PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join(pythonpath)
    return env


def outermost(paths: Iterable[str]) -> tuple[str, ...]:
    """``paths`` without duplicates and without any path inside another one of them."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(PurePosixPath(path).is_relative_to(k) for k in kept):
            kept.append(path)
    return tuple(kept)


# -- the host side ------------------------------------------------------------------------


def host_view(
    policy: SandboxPolicy, code_paths: Iterable[str], hidden: Iterable[str], cwd: str
) -> HostView:
    """The interpreter, the venv and ``code_paths`` (sys.path, the app's directory) read-only;
    ``hidden`` (the agent's home and logs) masked where a bind would show them."""
    links: list[tuple[str, str]] = []
    dirs = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))]
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            links.append((path, os.readlink(path)))
        elif os.path.isdir(path):
            dirs.append(path)
    dirs += [os.path.realpath(p) for p in code_paths if p and os.path.isdir(p)]
    binds = outermost(p for p in dirs if p != "/")
    under = [os.path.realpath(h) for h in hidden]
    masked = tuple(h for h in under if os.path.isdir(h) and _inside(h, binds))
    etc = ETC_FILES + (NET_ETC_FILES if policy.allow_net else ())
    return HostView(binds=binds, links=tuple(links), etc=etc, hidden=masked, cwd=cwd)


def _inside(path: str, binds: Iterable[str]) -> bool:
    return any(PurePosixPath(path).is_relative_to(b) for b in binds)


def privileged() -> bool:
    """Whether the agent is root: its guests then need a user namespace made for them."""
    return os.geteuid() == 0


def new_userns(uid: int, gid: int) -> int:
    """(Root only.) A user namespace mapping root and ``uid``/``gid`` to themselves, as an open
    descriptor for ``bwrap --userns``. util-linux's ``unshare --user`` makes it and runs a
    ``cat`` that waits on its stdin while the maps are written; the descriptor keeps the
    namespace after ``cat`` exits. (No ``preexec_fn``: Python code in a forked child of a
    threaded agent is unsafe, and its failure would be reported without its errno.) A failure
    is tried again twice, then raised as an OSError that says what ``unshare`` said."""
    for tries_left in reversed(range(USERNS_TRIES)):
        try:
            return _userns_once(uid, gid)
        except OSError:
            if not tries_left:
                raise
            time.sleep(0.05)
    raise AssertionError("unreachable")


def _userns_once(uid: int, gid: int) -> int:
    holder = subprocess.Popen(
        [UNSHARE, "--user", "cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _await_own_userns(holder)
        maps = f"0 0 1\n{uid} {uid} 1\n" if uid else "0 0 1\n"
        with open(f"/proc/{holder.pid}/uid_map", "w") as fh:
            fh.write(maps)
        gmaps = f"0 0 1\n{gid} {gid} 1\n" if gid else "0 0 1\n"
        with open(f"/proc/{holder.pid}/gid_map", "w") as fh:
            fh.write(gmaps)
        return os.open(f"/proc/{holder.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        assert holder.stdin is not None and holder.stderr is not None
        holder.stdin.close()
        holder.wait()
        holder.stderr.close()


def _await_own_userns(holder: subprocess.Popen[bytes]) -> None:
    """Until ``holder`` has left this process's user namespace (``unshare`` has run and exec'd
    ``cat``); an OSError naming the cause if it exits instead or takes longer than 10 s."""
    ours = os.readlink("/proc/self/ns/user")
    deadline = time.monotonic() + USERNS_WAIT_S
    while True:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            if os.readlink(f"/proc/{holder.pid}/ns/user") != ours:
                return
        if holder.poll() is not None:
            assert holder.stderr is not None
            said = holder.stderr.read().decode(errors="replace").strip()
            cause = said or f"exit status {holder.returncode}"
            raise OSError(f"unshare --user could not make a user namespace: {cause}")
        if time.monotonic() > deadline:
            raise OSError(f"unshare --user made no user namespace within {USERNS_WAIT_S:.0f} s")
        time.sleep(0.001)


def find_bwrap(policy: SandboxPolicy) -> str | None:
    if os.access(policy.bwrap, os.X_OK):
        return policy.bwrap
    return shutil.which("bwrap")


def probe(policy: SandboxPolicy, view: HostView, env: Mapping[str, str]) -> str | None:
    """Start the interpreter in the sandbox once: None if it works, else what went wrong."""
    try:
        policy = resolved(policy)
    except SandboxUnavailable as exc:
        return str(exc)
    try:
        fd = new_userns(policy.uid, policy.gid) if privileged() else None
    except OSError as exc:
        return f"no user namespace for a guest: {exc}"
    command = [sys.executable, "-c", "import conveyor.agents.guest"]
    try:
        done = subprocess.run(
            argv(policy, view, command, env, userns_fd=fd),
            pass_fds=() if fd is None else (fd,),
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not start a guest: {exc}"
    finally:
        if fd is not None:
            os.close(fd)
    if done.returncode != 0:
        # The last line says why (a traceback's frames above it are the probe's, not news).
        lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no output"]
        return f"bwrap could not start a guest (exit {done.returncode}): {lines[-1]}"
    return None


def resolved(policy: SandboxPolicy) -> SandboxPolicy:
    """``policy`` with the bwrap binary found here (``bwrap`` on PATH when not at its path)."""
    found = find_bwrap(policy)
    if found is None:
        raise SandboxUnavailable(
            f"bubblewrap is not installed ({policy.bwrap} not found); {INSTALL_HINT}, "
            "or run trusted code with --sandbox none"
        )
    return policy if policy.bwrap == found else replace(policy, bwrap=found)


def make_non_dumpable() -> bool:
    """prctl(PR_SET_DUMPABLE, 0): no process of the same user may read this one's
    /proc/<pid>/environ or memory, or ptrace it. True when it took effect (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0:
            return bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)
    return False
