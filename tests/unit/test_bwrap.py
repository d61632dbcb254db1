"""The bubblewrap command line built from a SandboxPolicy (pure: nothing is started)."""

from __future__ import annotations

import os

import pytest

from conveyor.agents import bwrap, host
from conveyor.agents.bwrap import HostView, SandboxPolicy

VIEW = HostView(
    binds=("/opt/python", "/srv/app"),
    links=(("/lib", "usr/lib"),),
    etc=("/etc/ld.so.cache",),
    hidden=("/srv/app/.conveyor",),
    cwd="/srv/app",
)
COMMAND = ["/opt/python/bin/python", "-m", "conveyor.agents.guest"]


def pairs(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_an_unprivileged_agent_unshares_everything_and_maps_the_guest_user() -> None:
    args = bwrap.argv(SandboxPolicy(uid=1234, gid=4321), VIEW, COMMAND, {"A": "1"})
    assert "--unshare-all" in args and "--share-net" not in args
    assert pairs(args, "--uid") == ["1234"] and pairs(args, "--gid") == ["4321"]
    assert {"--die-with-parent", "--new-session", "--clearenv"} <= set(args)
    assert args[-len(COMMAND) - 1 :] == ["--", *COMMAND]


def test_egress_shares_the_network_and_nothing_else() -> None:
    plain = bwrap.argv(SandboxPolicy(), VIEW, COMMAND, {})
    egress = bwrap.argv(SandboxPolicy(allow_net=True), VIEW, COMMAND, {})
    assert [a for a in egress if a != "--share-net"] == plain


def test_a_root_agent_joins_its_user_namespace_and_unshares_the_network() -> None:
    args = bwrap.argv(SandboxPolicy(), VIEW, COMMAND, {}, userns_fd=7)
    assert pairs(args, "--userns") == ["7"] and "--unshare-all" not in args
    assert {"--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"} <= set(args)
    assert pairs(args, "--cap-add") == ["CAP_SETUID", "CAP_SETGID"]
    egress = bwrap.argv(SandboxPolicy(allow_net=True), VIEW, COMMAND, {}, userns_fd=7)
    assert "--unshare-net" not in egress
    assert bwrap.guest_args(SandboxPolicy(), privileged=True)[-2:] == ["--drop-to", "65534:65534"]
    assert "--drop-to" not in bwrap.guest_args(SandboxPolicy(), privileged=False)


def test_code_is_read_only_scratch_is_a_private_tmpfs_and_the_home_is_masked() -> None:
    args = bwrap.argv(SandboxPolicy(tmp_mb=16), VIEW, COMMAND, {})
    assert pairs(args, "--ro-bind") == ["/opt/python", "/srv/app"]
    assert "--bind" not in args and "--dev-bind" not in args  # nothing writable of the host
    assert pairs(args, "--tmpfs") == ["/tmp", "/srv/app/.conveyor"]
    assert pairs(args, "--size") == [str(16 * 2**20)]
    # The mask comes after the bind it hides something of.
    assert args.index("/srv/app/.conveyor") > args.index("/srv/app")
    assert pairs(args, "--proc") == ["/proc"] and pairs(args, "--dev") == ["/dev"]
    assert pairs(args, "--chdir") == ["/srv/app"]
    # Parents are made traversable for the guest's user (bwrap makes them 0700 for root).
    assert args[args.index("/opt") - 3 : args.index("/opt")] == ["--perms", "0755", "--dir"]


def test_the_environment_is_only_what_is_given() -> None:
    args = bwrap.argv(SandboxPolicy(), VIEW, COMMAND, {"B": "2", "A": "1"})
    assert args.index("--clearenv") < args.index("--setenv")
    assert [args[i + 1 : i + 3] for i, a in enumerate(args) if a == "--setenv"] == [
        ["A", "1"],
        ["B", "2"],
    ]


def test_a_guests_environment_has_no_credentials() -> None:
    environ = {
        "PATH": "/usr/bin",
        "LANG": "C.UTF-8",
        "CONVEYOR_API_KEY": "secret",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "DATABASE_URL": "postgres://u:secret@db",
    }
    env = bwrap.guest_env(environ, ["/srv/app", "/opt/lib"])
    assert "secret" not in repr(env)
    assert env["PATH"] == "/usr/bin" and env["HOME"] == env["TMPDIR"] == "/tmp"
    assert env["PYTHONPATH"] == os.pathsep.join(["/srv/app", "/opt/lib"])


def test_outermost_keeps_one_bind_per_tree() -> None:
    paths = ["/srv/app/tests", "/srv/app", "/srv/application", "/usr", "/usr/lib", "/srv/app"]
    assert bwrap.outermost(paths) == ("/srv/app", "/srv/application", "/usr")


def test_a_missing_bwrap_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(bwrap.SandboxUnavailable, match="apt-get install bubblewrap"):
        bwrap.resolved(SandboxPolicy(bwrap="/nonexistent/bwrap"))


def test_the_agent_hides_its_key_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[bool] = []
    monkeypatch.setattr(bwrap, "make_non_dumpable", lambda: called.append(True) or True)
    monkeypatch.setenv("CONVEYOR_API_KEY", "secret")
    host._hide_credentials()
    assert called and "CONVEYOR_API_KEY" not in os.environ
