"""Class: the caller's git environment and configuration leak into kvpatch's git calls.

A git hook runs with GIT_DIR, GIT_WORK_TREE, GIT_INDEX_FILE ... set; a parent ``git -c``
exports GIT_CONFIG_PARAMETERS; a user's ~/.gitconfig may set hooks, templates, fsmonitor.
None of it may reach the git commands kvpatch runs on its own repositories, and a leaked
repository location never reaches the read of a user's tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import HEADER, fixture_text, make_tree
from source_helpers import clean_git, quiet, remote_repo, repo_state, sdist_index, user_repo

from kvpatch.source import git as gitcmd
from kvpatch.source.fetch import fetch_release
from kvpatch.source.workspace import Tree, checkout


@pytest.fixture
def leaked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's repository, and the environment a git hook of it runs kvpatch with."""
    repo = user_repo(tmp_path / "user-repo")
    gitdir = repo / ".git"
    monkeypatch.setenv("GIT_DIR", str(gitdir))
    monkeypatch.setenv("GIT_WORK_TREE", str(repo))
    monkeypatch.setenv("GIT_INDEX_FILE", str(gitdir / "index"))
    monkeypatch.setenv("GIT_OBJECT_DIRECTORY", str(gitdir / "objects"))
    monkeypatch.setenv("GIT_PREFIX", "")
    monkeypatch.setenv("GIT_EDITOR", ":")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    return repo


@pytest.fixture
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Hooks every way a user's environment can name them: ~/.gitconfig (hooksPath and a
    template directory), GIT_CONFIG_PARAMETERS (a parent 'git -c'), GIT_TEMPLATE_DIR.
    Each hook touches a file in the returned directory when it runs."""
    ran = tmp_path / "hooks-ran"
    ran.mkdir()
    hookdir = tmp_path / "user-hooks"
    template = tmp_path / "user-template"
    for folder in (hookdir, template / "hooks"):
        folder.mkdir(parents=True)
        for name in ("post-commit", "post-checkout", "pre-commit", "reference-transaction", "post-index-change"):
            hook = folder / name
            hook.write_text(f"#!/bin/sh\ntouch '{ran}/{folder.parent.name}-{name}'\n")
            hook.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    config = (
        f"[core]\n\thooksPath = {hookdir}\n\tfsmonitor = {hookdir}/post-commit\n[init]\n\ttemplateDir = {template}\n"
    )
    (home / ".gitconfig").write_text(config)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    monkeypatch.delenv("GIT_CONFIG_NOSYSTEM", raising=False)
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.hookspath'='{hookdir}'")
    monkeypatch.setenv("GIT_TEMPLATE_DIR", str(template))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    return ran


def test_a_leaked_git_dir_does_not_receive_the_sdist(
    leaked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = repo_state(leaked)
    monkeypatch.setenv("PIP_INDEX_URL", sdist_index(tmp_path / "index").as_uri())
    tree = fetch_release("0.10.2", remote=str(tmp_path / "no-remote.git"), cache=tmp_path / "cache", console=quiet())
    assert repo_state(leaked) == before
    assert (tree / ".git").is_dir()
    assert clean_git(tree, "rev-parse", "HEAD") == clean_git(tree, "rev-parse", "v0.10.2^{commit}")
    assert HEADER in clean_git(tree, "ls-files").splitlines()
    assert clean_git(tree, "status", "--porcelain") == ""


def test_a_leaked_git_dir_does_not_receive_a_clone(leaked: Path, tmp_path: Path) -> None:
    remote = remote_repo(tmp_path)
    before = repo_state(leaked)
    tree = fetch_release("0.10.2", remote=str(remote), cache=tmp_path / "cache", console=quiet())
    assert repo_state(leaked) == before
    assert clean_git(tree, "rev-parse", "HEAD") == clean_git(remote, "rev-parse", "v0.10.2^{commit}")
    assert clean_git(tree, "status", "--porcelain") == ""


def test_a_leaked_git_dir_does_not_receive_a_checkout(leaked: Path, tmp_path: Path) -> None:
    remote = remote_repo(tmp_path)
    release = tmp_path / "release"
    clean_git(tmp_path, "clone", "-q", str(remote), str(release))
    before = repo_state(leaked)
    dest = tmp_path / "work" / ".kvpatch" / "vllm-0.10.2"
    checkout(release, dest, "v0.10.2")
    assert repo_state(leaked) == before
    assert (dest / HEADER).is_file()
    assert clean_git(dest, "status", "--porcelain") == ""


def test_the_committed_header_is_the_trees_own_under_a_leaked_git_dir(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    tree = make_tree(tmp_path / "vllm", fixture_text())
    other = user_repo(tmp_path / "other", {HEADER: "// another project's header\n"})
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    monkeypatch.setenv("GIT_INDEX_FILE", str(other / ".git" / "index"))
    assert Tree(tree).committed_header() == (fixture_text(), "")


def test_the_users_hooks_and_templates_never_run(hooks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", sdist_index(tmp_path / "index").as_uri())
    remote = str(remote_repo(tmp_path, "0.9.2"))
    # the remote lacks v0.10.2: the sdist is unpacked and committed
    release = fetch_release("0.10.2", remote=remote, cache=tmp_path / "cache", console=quiet())
    checkout(release, tmp_path / "work" / ".kvpatch" / "vllm-0.10.2", "v0.10.2")
    cloned = fetch_release("0.9.2", remote=remote, cache=tmp_path / "cache", console=quiet())
    checkout(cloned, tmp_path / "work" / ".kvpatch" / "vllm-0.9.2", "v0.9.2")
    assert sorted(p.name for p in hooks.iterdir()) == []
    assert not (release / ".git" / "hooks").exists()  # no template copied in


def test_reading_a_users_tree_keeps_their_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Their global config still counts for their tree (safe.directory, autocrlf)."""
    env = gitcmd.user_env(base={"HOME": "/h", "GIT_CONFIG_GLOBAL": "/h/cfg", "GIT_DIR": "/x/.git",
                                "GIT_WORK_TREE": "/x", "GIT_INDEX_FILE": "/x/i", "GIT_CONFIG_PARAMETERS": "'a.b'='c'",
                                "GIT_CEILING_DIRECTORIES": "/", "GIT_NAMESPACE": "n", "SSH_ASKPASS": "/bin/pop",
                                "PATH": "/bin"})  # fmt: skip
    assert {k: v for k, v in env.items() if k not in ("LC_ALL", "LANGUAGE")} == {
        "HOME": "/h",
        "GIT_CONFIG_GLOBAL": "/h/cfg",
        "PATH": "/bin",
        "GIT_TERMINAL_PROMPT": "0",
    }


def test_own_repositories_get_only_kvpatchs_variables() -> None:
    leaked = {name: "/x" for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                                      "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_CONFIG", "GIT_CONFIG_GLOBAL",
                                      "GIT_CONFIG_SYSTEM", "GIT_CONFIG_COUNT", "GIT_CONFIG_KEY_0", "GIT_CONFIG_VALUE_0",
                                      "GIT_CEILING_DIRECTORIES", "GIT_NAMESPACE", "GIT_COMMON_DIR", "GIT_TEMPLATE_DIR",
                                      "GIT_EXEC_PATH", "GIT_SSL_CAINFO", "git_dir")}  # fmt: skip
    env = gitcmd.own_env(base={**leaked, "PATH": "/bin"}, extra={"GIT_AUTHOR_NAME": "kvpatch"})
    assert {k for k in env if k.upper().startswith("GIT_")} == {
        "GIT_TERMINAL_PROMPT",
        "GIT_CONFIG_GLOBAL",
        "GIT_CONFIG_NOSYSTEM",
        "GIT_AUTHOR_NAME",
    }
    assert env["GIT_CONFIG_GLOBAL"] == os.devnull and env["PATH"] == "/bin"
    network = gitcmd.own_env(network=True, base={**leaked})
    assert network["GIT_SSL_CAINFO"] == "/x" and "GIT_DIR" not in network
    argv = gitcmd.own("git", "status", git_dir=Path("/r/.git"))
    assert argv[:1] == ["git"] and argv[-2:] == ["--git-dir=/r/.git", "status"]
    assert f"core.hooksPath={os.devnull}" in argv and "core.fsmonitor=false" in argv


@pytest.mark.parametrize("remote", ["ext::sh -c touch% /tmp/kvpatch-pwned", "fd::17", "--upload-pack=touch x"])
def test_remotes_that_run_programs_are_refused(remote: str) -> None:
    with pytest.raises(ValueError):
        gitcmd.check_remote(remote)


def test_every_git_call_goes_through_the_git_module() -> None:
    """No module of kvpatch.source runs git itself, or through GitPython (which cannot
    drop a variable from the environment it passes on)."""
    import re

    import kvpatch.source as source

    for path in Path(source.__file__).parent.glob("*.py"):
        if path.name == "git.py":
            continue
        text = path.read_text()
        assert not re.search(r"^\s*(import git\b|from git\b)", text, re.M), path.name
        calls = re.findall(r"subprocess\.(?:run|Popen|call|check_output|check_call)\((.{0,60})", text, re.S)
        assert all("sys.executable" in call for call in calls), (path.name, calls)  # pip config only
