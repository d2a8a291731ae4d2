"""``--json PATH`` is an output like any other: checked, before any work, against the files
kvpatch keeps (the tree's header, the state), the command's inputs and the plugin's bundle;
a refused one is one line, exit 2, with everything it names unchanged."""

from __future__ import annotations

import shutil

from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER


def test_apply_and_sites_never_write_their_report_over_the_header_the_state_or_the_config(applied, work):
    header = applied / HEADER
    state = work / ".kvpatch" / "state.json"
    config = work / "kvpatch.toml"
    config.write_text("lookahead = 2\n")
    before = {p: p.read_bytes() for p in (header, state, config)}
    cases = [
        (["apply", "--tree", str(applied), "--json", str(header)], "the tree's header"),
        (["apply", "--json", str(state)], "kvpatch's state directory"),
        (["apply", "--tree", str(applied), "--config", str(config), "--json", str(config)], "is --config"),
        (["sites", "--tree", str(applied), "--json", str(header)], "the tree's header"),
    ]
    for args, why in cases:
        assert_one_line_error(run_cli(*args, cwd=work), 2, why)
    assert {p: p.read_bytes() for p in before} == before


def test_no_output_lands_in_the_trees_sources_or_its_git_directory(applied, work, tmp_path):
    """Before: ``apply --json TREE/csrc/attention/attention_utils.cuh`` replaced a file the header
    includes (the next apply failed), ``diff -o`` emptied one, ``--json TREE/.git/config`` broke
    the repository. After: refused like the header itself, one line, nothing written."""
    included = applied / "csrc" / "attention" / "attention_utils.cuh"
    included.write_text("// included\n")
    git_config = applied / ".git" / "config"
    before = {p: p.read_bytes() for p in (included, git_config)}
    cases = [
        (["apply", "--tree", str(applied), "--json", str(included)], "the tree's sources (csrc/)"),
        (["diff", "--tree", str(applied), "-o", str(included)], "the tree's sources (csrc/)"),
        (["sites", "--tree", str(applied), "--json", str(applied / "csrc" / "new.json")], "the tree's sources"),
        (["apply", "--tree", str(applied), "--json", str(git_config)], "the tree's git directory"),
    ]
    for args, why in cases:
        assert_one_line_error(run_cli(*args, cwd=work), 2, why)
    assert {p: p.read_bytes() for p in before} == before and not (applied / "csrc" / "new.json").exists()
    # beside the sources, in the checkout's root, an output is as welcome as anywhere
    assert run_cli("diff", "--tree", str(applied), "-o", str(applied / "kvpatch.patch"), cwd=work).returncode == 0


def test_an_unwritable_report_is_refused_before_the_work(applied, work, monkeypatch):
    """apply patches nothing and build compiles nothing when --json cannot be written."""
    from kvpatch import jit

    monkeypatch.setattr(jit, "build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("compiled")))
    header = applied / HEADER
    before = header.read_bytes()
    assert_one_line_error(run_cli("apply", "--tree", str(applied), "--lookahead", "2", "--json", "/proc/kvpatch/x",
                                  cwd=work), 2, "--json")  # fmt: skip
    assert header.read_bytes() == before
    assert_one_line_error(run_cli("build", "--json", "/proc/kvpatch/x", cwd=work), 2, "--json")


def test_plugin_enable_never_writes_its_report_into_the_bundle(applied, work, tmp_path):
    bundle = tmp_path / "bundle"
    assert_one_line_error(run_cli("plugin", "enable", "--dir", str(bundle), "--json", str(bundle / "bundle.json"),
                                  cwd=work), 2, "the plugin's bundle")  # fmt: skip
    assert not bundle.exists()


def test_no_command_writes_its_output_into_the_environments_bundle_or_kvpatchs_state(applied, work, tmp_path):
    """The plugin's bundle (``$KVPATCH_PLUGIN_DIR``) is kept by every command that writes a file,
    as ``.kvpatch/`` is: before, ``plugin status --json`` and ``plugin check --json`` wrote over
    ``bundle.json`` or ``state.json`` (vLLM then refused the bundle and ``disable`` could not
    remove it), and ``plugin bench``, ``bench``, ``validate``, ``bench-decode``, ``tune`` and
    ``diff`` checked only the workspace."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    manifest = bundle / "bundle.json"
    manifest.write_text('{"format": 1}\n')
    state = work / ".kvpatch" / "state.json"
    before = {p: p.read_bytes() for p in (manifest, state)}
    env = {"KVPATCH_PLUGIN_DIR": str(bundle)}
    commands = [["plugin", "status", "--json"], ["plugin", "check", "--json"], ["plugin", "bench", "--json"],
                ["bench", "--json"], ["validate", "--json"], ["bench-decode", "--json"], ["tune", "-o"],
                ["diff", "-o"], ["build", "--json"], ["sites", "--json"]]  # fmt: skip
    for command in commands:
        for target, why in ((manifest, "the plugin's bundle"), (state, "kvpatch's state directory")):
            proc = run_cli(*command, str(target), cwd=work, env=env)
            assert_one_line_error(proc, 2, why)
    assert {p: p.read_bytes() for p in before} == before


def test_no_command_writes_into_another_workspaces_state(applied, work, tmp_path):
    """Another directory's ``.kvpatch/`` (its state, its lock, the tree kvpatch fetched there) is
    kept as this one's is: ``tune -o ../A/.kvpatch/state.json`` run from B overwrote A's state."""
    other = tmp_path / "other"
    shutil.copytree(work / ".kvpatch", other / ".kvpatch")
    state = other / ".kvpatch" / "state.json"
    before = state.read_bytes()
    for command in (["tune", "-o"], ["diff", "-o"], ["sites", "--json"], ["bench", "--json"]):
        for target in (state, other / ".kvpatch" / "new.json", other / ".kvpatch" / ".." / ".kvpatch" / "x"):
            proc = run_cli(*command, str(target), cwd=work)
            assert_one_line_error(proc, 2, "inside a kvpatch workspace's state directory")
    assert state.read_bytes() == before and not (other / ".kvpatch" / "new.json").exists()


def test_no_command_writes_into_kvpatchs_release_or_build_cache(applied, work, tmp_path):
    """A release kvpatch fetched (its files, which a later build or script reads) and a built
    library another command reuses are kept as the tree's sources are: before, ``diff -o`` wrote
    the diff over a cached release's header. The cache's root itself (a ``KVPATCH_CACHE`` that is
    any folder) is not kept: only kvpatch's folders in it."""
    cache = tmp_path / "cache"
    cached = cache / "releases" / "v0.10.2" / "csrc" / "attention" / "attention_kernels.cuh"
    cached.parent.mkdir(parents=True)
    cached.write_text("// a cached release's header\n")
    (cache / "builds").mkdir()
    env = {"KVPATCH_CACHE": str(cache)}
    for command in (["diff", "-o"], ["sites", "--json"], ["tune", "-o"], ["bench", "--json"]):
        for target, why in (
            (cached, "kvpatch's release cache"),
            (cache / "builds" / "x.json", "kvpatch's build cache"),
        ):
            assert_one_line_error(run_cli(*command, str(target), cwd=work, env=env), 2, why)
    assert cached.read_text() == "// a cached release's header\n" and not (cache / "builds" / "x.json").exists()
    assert run_cli("diff", "-o", str(cache / "kvpatch.patch"), cwd=work, env=env).returncode == 0


def test_plugin_status_keeps_the_bundle_its_dir_names(work, tmp_path):
    bundle = tmp_path / "elsewhere"
    bundle.mkdir()
    (bundle / "bundle.json").write_text("{}\n")
    proc = run_cli("plugin", "status", "--dir", str(bundle), "--json", str(bundle / "bundle.json"), cwd=work)
    assert_one_line_error(proc, 2, "the plugin's bundle")
    assert (bundle / "bundle.json").read_text() == "{}\n"


def test_an_output_that_is_stdout_s_file_a_socket_or_a_device_that_cannot_open_is_refused_first(applied, work,
                                                                                                 tmp_path):  # fmt: skip
    """Before: ``sites --json F > F`` exited 0 with only the JSON left (the table lost), and an
    output that was a socket, or /dev/tty with no terminal, passed the check: ``apply`` patched
    the header, then failed to write its report (exit 1). After: one line, exit 2, nothing done."""
    import os
    import socket
    import subprocess
    import sys

    from cli.cli_helpers import kvpatch_env

    report = tmp_path / "report.json"
    link = tmp_path / "link.json"
    link.symlink_to(report)
    for args in (["sites", "--tree", str(applied), "--json", str(report)],
                 ["sites", "--tree", str(applied), "--json", str(link)]):  # fmt: skip
        with report.open("ab") as out:
            proc = subprocess.run([sys.executable, "-m", "kvpatch", *args], cwd=work, env=kvpatch_env(work),
                                  stdout=out, stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 2 and "is where stdout goes (the shell's redirection)" in proc.stderr, proc.stderr
    assert report.read_text() == ""
    header = applied / HEADER
    before = header.read_bytes()
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "s.sock"))
        assert_one_line_error(run_cli("apply", "--tree", str(applied), "--lookahead", "2", "--json",
                                      str(tmp_path / "s.sock"), cwd=work), 2, "is a socket")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "kvpatch", "apply", "--tree", str(applied), "--lookahead", "2", "--json", "/dev/tty"],
        cwd=work,
        env=kvpatch_env(work),
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )  # fmt: skip  (no controlling terminal: /dev/tty is ENXIO)
    if os.path.exists("/dev/tty"):
        assert proc.returncode == 2 and "cannot be opened for writing" in proc.stderr, proc.stderr
    assert header.read_bytes() == before
