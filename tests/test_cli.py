"""The ``kvpatch`` command end to end (a subprocess, as a user runs it) on git trees made
from the fixture header. No network: every command here uses ``--tree``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import STOCK, fixture_text, git, golden_text, make_tree
from kvpatch.config import make_config
from kvpatch.source.fetch import HEADER

KVPATCH = str(Path(sys.executable).parent / "kvpatch")
#: The checkout under test: the console script imports kvpatch from wherever it was
#: installed (editable, maybe another checkout), so PYTHONPATH puts this one first.
ROOT = Path(__file__).resolve().parents[1]


def kvpatch_env(cwd: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "KVPATCH_CACHE")}
    env.update(COLUMNS="400", NO_COLOR="1", TERM="dumb", KVPATCH_CACHE=str(cwd / "no-cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))  # fmt: skip
    env.update(extra)
    return env


#: The default rules as the marker writes them (the shipped tuned table, kvpatch.config.DEFAULT_OVERRIDES).
DEFAULT_RULES = make_config().marker().split(" quantized=skip", 1)[1]
DEFAULT_MARKER = "lookahead=1 size=auto align=16 caches=kv hint=none placement=start scope=cta issue=call quantized=skip" + DEFAULT_RULES


def kvpatch(*args: str, cwd: Path, columns: int = 400, env: dict[str, str] | None = None,
            input: str | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    full = kvpatch_env(cwd, COLUMNS=str(columns), **(env or {}))
    return subprocess.run([KVPATCH, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=120,
                          input=input)  # fmt: skip


def assert_one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    """Exit ``code``, nothing on stdout, and exactly one line 'error: ...' on stderr."""
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0]
    return lines[0]


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """The directory kvpatch runs in (where it keeps .kvpatch/state.json)."""
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
def header(git_tree: Path) -> Path:
    return git_tree / HEADER


def committed(tree: Path) -> bytes:
    return git(tree, "show", f"HEAD:{HEADER}", text=False)


# --------------------------------------------------------------------------- apply


def test_apply_patches_and_says_what_next(git_tree: Path, header: Path, work: Path) -> None:
    proc = kvpatch("apply", "--tree", str(git_tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"patched {header}"
    assert f"config: {DEFAULT_MARKER}" in lines
    assert "next: kvpatch diff  |  kvpatch build --arch 9.0a  |  kvpatch revert" in lines
    assert any("key" in line and "line 48" in line and "line 50" in line for line in lines)
    assert header.read_text() == golden_text("default")
    assert json.loads((work / ".kvpatch/state.json").read_text())["tree"] == str(git_tree)


def test_second_apply_changes_nothing(git_tree: Path, header: Path, work: Path) -> None:
    assert kvpatch("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    os.utime(header, ns=(1_000_000_000, 1_000_000_000))
    before = header.stat()
    proc = kvpatch("apply", "--tree", str(git_tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"already applied ({DEFAULT_MARKER}): {header}"
    after = header.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert header.read_text() == golden_text("default")


def test_apply_another_config_replaces_the_injection(git_tree: Path, header: Path, work: Path) -> None:
    assert kvpatch("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    proc = kvpatch("apply", "--tree", str(git_tree), "--preset", "paper", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:2] == [f"replaced {header}", f"  previous: {DEFAULT_MARKER}"]
    assert header.read_text() == golden_text("paper")


def test_apply_with_a_config_file(git_tree: Path, header: Path, work: Path) -> None:
    (work / "kvpatch.toml").write_text('[kvpatch]\nplacement = "end"\nscope = "kv-head"\ninherit-rules = false\n')
    proc = kvpatch("apply", "--tree", str(git_tree), "--config", "kvpatch.toml", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert header.read_text() == golden_text("placement-end-scope-kv-head")


def test_options_override_the_config_file(git_tree: Path, header: Path, work: Path) -> None:
    (work / "kvpatch.toml").write_text('lookahead = 3\ncache-hint = "evict_last"\n')
    proc = kvpatch("apply", "--tree", str(git_tree), "--config", "kvpatch.toml", "--lookahead", "2", cwd=work)
    assert proc.returncode == 0, proc.stderr
    marker = "lookahead=2 size=auto align=16 caches=kv hint=evict_last placement=start scope=cta issue=call quantized=skip" + DEFAULT_RULES
    assert f"config: {marker}" in proc.stdout.splitlines()
    assert header.read_text().count(f"// kvpatch:begin key {marker}\n") == 1


def test_apply_json(git_tree: Path, header: Path, work: Path) -> None:
    proc = kvpatch("apply", "--tree", str(git_tree), "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["header"], report["changed"], report["previous"]) == (str(header), True, [])
    assert report["marker"] == DEFAULT_MARKER
    assert report["config"]["size"] == "auto"
    key, value = report["sites"]["key"], report["sites"]["value"]
    assert (key["line"], value["line"]) == (48, 70)
    assert report["edits"] == [
        {"offset": report["sites"]["before_function"], "length": 0, "what": "helpers"},
        {"offset": key["after_block_number"], "length": 0, "what": "key prefetch"},
        {"offset": key["before_loop"], "length": 0, "what": "key split"},
        {"offset": value["after_block_number"], "length": 0, "what": "value prefetch"},
    ]
    again = json.loads(kvpatch("apply", "--tree", str(git_tree), "--json", cwd=work).stdout)
    assert (again["changed"], again["previous"]) == (False, [DEFAULT_MARKER])


# --------------------------------------------------------------------------- local edits


def test_local_edit_is_refused(git_tree: Path, header: Path, work: Path) -> None:
    edited = "// my local note\n" + fixture_text(STOCK)
    header.write_text(edited)
    proc = kvpatch("apply", "--tree", str(git_tree), cwd=work, columns=40)
    assert_one_line_error(proc, 4, str(header), "local edits", "--force")
    assert header.read_text() == edited


def test_force_patches_keeping_the_local_edit(git_tree: Path, header: Path, work: Path) -> None:
    header.write_text("// my local note\n" + fixture_text(STOCK))
    proc = kvpatch("apply", "--tree", str(git_tree), "--force", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert header.read_text() == "// my local note\n" + golden_text("default")


def test_local_edit_of_a_patched_header_is_refused(git_tree: Path, header: Path, work: Path) -> None:
    assert kvpatch("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    edited = header.read_text().replace("  float acc = 0.f;", "  float acc = 1.f;")
    header.write_text(edited)
    assert_one_line_error(kvpatch("apply", "--tree", str(git_tree), "--caches", "k", cwd=work), 4, "--force")
    assert header.read_text() == edited


# --------------------------------------------------------------------------- diff and revert


def test_diff_applies_to_a_pristine_clone(git_tree: Path, header: Path, work: Path, tmp_path: Path) -> None:
    assert kvpatch("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    proc = kvpatch("diff", cwd=work)  # the tree of the last apply here
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"diff --git a/{HEADER} b/{HEADER}\n--- a/{HEADER}\n+++ b/{HEADER}\n@@ ")
    patch_file = tmp_path / "kvpatch.patch"
    patch_file.write_text(proc.stdout)

    pristine = tmp_path / "pristine"
    git(tmp_path, "clone", "-q", str(git_tree), str(pristine))
    subprocess.run(["git", "apply", "--check", str(patch_file)], cwd=pristine, check=True)
    subprocess.run(["patch", "-p1", "--dry-run", "-i", str(patch_file)], cwd=pristine, check=True, capture_output=True)
    subprocess.run(["git", "apply", str(patch_file)], cwd=pristine, check=True)
    assert (pristine / HEADER).read_bytes() == header.read_bytes()


def test_diff_to_a_file(git_tree: Path, work: Path) -> None:
    assert kvpatch("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    shown = kvpatch("diff", "--tree", str(git_tree), cwd=work).stdout
    proc = kvpatch("diff", "--tree", str(git_tree), "--output", "f.patch", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "wrote f.patch"
    assert (work / "f.patch").read_text() == shown != ""


def test_diff_of_a_stock_tree(git_tree: Path, work: Path) -> None:
    proc = kvpatch("diff", "--tree", str(git_tree), cwd=work)
    assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (0, "", "no changes: the header is stock")


def test_revert_restores_the_committed_bytes(git_tree: Path, header: Path, work: Path) -> None:
    assert kvpatch("apply", "--tree", str(git_tree), "--preset", "paper", cwd=work).returncode == 0
    assert header.read_bytes() != committed(git_tree)
    proc = kvpatch("revert", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"reverted {header}"
    assert header.read_bytes() == committed(git_tree)
    again = kvpatch("revert", "--tree", str(git_tree), cwd=work)
    assert again.stdout.strip() == f"nothing to revert: {header} is stock"
    assert git(git_tree, "status", "--porcelain") == ""


def test_revert_restores_a_crlf_header(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "crlf", fixture_text(STOCK).replace("\n", "\r\n"))
    before = (tree / HEADER).read_bytes()
    assert kvpatch("apply", "--tree", str(tree), cwd=work).returncode == 0
    assert kvpatch("revert", cwd=work).returncode == 0
    assert (tree / HEADER).read_bytes() == before


# --------------------------------------------------------------------------- sites


def test_sites_json(git_tree: Path, header: Path, work: Path) -> None:
    proc = kvpatch("sites", "--tree", str(git_tree), "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["header"] == str(header)
    assert (found["lane_var"], found["cache_type"], found["head_var"], found["queries_per_kv_var"]) == (
        "lane", "cache_t", "head_idx", "num_queries_per_kv",
    )  # fmt: skip
    assert (found["key"]["line"], found["key"]["block_number_line"], found["key"]["cache_param"]) == (48, 50, "k_cache")
    assert (found["value"]["line"], found["value"]["block_number_line"], found["value"]["cache_param"]) == (70, 72, "v_cache")
    assert found["key"]["head_offset_expr"] == "kv_head_idx * kv_head_stride"


def test_sites_of_a_patched_tree_are_those_of_its_stock_header(git_tree: Path, work: Path) -> None:
    stock = json.loads(kvpatch("sites", "--tree", str(git_tree), "--json", cwd=work).stdout)
    assert (stock.pop("injected"), stock.pop("injection_intact")) == ({"key": None, "value": None}, True)
    assert kvpatch("apply", "--tree", str(git_tree), "--caches", "k", cwd=work).returncode == 0
    patched = json.loads(kvpatch("sites", "--json", cwd=work).stdout)
    marker = DEFAULT_MARKER.replace("caches=kv", "caches=k")
    assert (patched.pop("injected"), patched.pop("injection_intact")) == ({"key": marker, "value": None}, True)
    assert patched == stock


def test_sites_table_shows_what_is_injected_at_each_site(git_tree: Path, work: Path) -> None:
    assert "no" in kvpatch("sites", "--tree", str(git_tree), cwd=work).stdout.splitlines()[-2]
    assert kvpatch("apply", "--tree", str(git_tree), "--caches", "v", "--lookahead", "3", cwd=work).returncode == 0
    lines = kvpatch("sites", cwd=work).stdout.splitlines()
    key = next(line for line in lines if line.lstrip("│ ").startswith("key"))
    value = next(line for line in lines if line.lstrip("│ ").startswith("value"))
    assert key.rstrip(" │").endswith("no")
    assert "lookahead=3 size=auto align=16 caches=v" in value and "patched: -" not in "\n".join(lines)


def test_sites_table(git_tree: Path, header: Path, work: Path) -> None:
    proc = kvpatch("sites", "--tree", str(git_tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"{header}: k/v sites in paged_attention_kernel (line 14)"
    assert any("value" in line and "line 70" in line and "block_idx += NUM_WARPS" in line for line in proc.stdout.splitlines())


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lookahead", "0"], "error: invalid lookahead 0: must be >= 1"),
        (["--size", "100"], "error: invalid size 100: must be a positive multiple of 16 bytes"),
        (["--align", "24"], "error: invalid align 24: must be a power of two >= 16"),
        (["--caches", "q"], "error: invalid caches 'q': choose one of k, v, kv"),
        (["--scope", "warp"], "error: invalid scope 'warp': choose one of cta, kv-head, kv-head-rotate"),
        (["--preset", "paper", "--lookahead", "2"], "error: --preset paper fixes lookahead; drop those options"),
    ],
)
def test_invalid_parameters(args: list[str], message: str, git_tree: Path, header: Path, work: Path) -> None:
    proc = kvpatch("apply", "--tree", str(git_tree), *args, cwd=work, columns=40)
    assert assert_one_line_error(proc, 2) == message
    assert header.read_bytes() == committed(git_tree)
    assert not (work / ".kvpatch").exists()


def test_invalid_config_file(git_tree: Path, header: Path, work: Path) -> None:
    (work / "kvpatch.toml").write_text("lookahaed = 2\n")
    proc = kvpatch("apply", "--tree", str(git_tree), "--config", "kvpatch.toml", cwd=work)
    assert assert_one_line_error(proc, 2) == "error: unknown configuration key(s): lookahaed"
    assert header.read_bytes() == committed(git_tree)


@pytest.mark.parametrize("args", [["--lookahead", "two"], ["--bogus"]], ids=["not-an-int", "unknown-option"])
def test_usage_errors_from_option_parsing(args: list[str], git_tree: Path, header: Path, work: Path) -> None:
    proc = kvpatch("apply", "--tree", str(git_tree), *args, cwd=work)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert args[0] in proc.stderr
    assert header.read_bytes() == committed(git_tree)


def test_diff_without_state_says_apply_first(work: Path) -> None:
    proc = kvpatch("diff", cwd=work, columns=40)
    assert assert_one_line_error(proc, 2) == (
        "error: no tree: run 'kvpatch apply --vllm X' here first, or pass --tree PATH"
    )


@pytest.mark.parametrize("command", ["revert", "sites"])
def test_other_commands_without_state(command: str, work: Path) -> None:
    assert_one_line_error(kvpatch(command, cwd=work), 2, "run 'kvpatch apply --vllm X' here first")


@pytest.mark.parametrize("command", ["apply", "sites"])
def test_vllm_and_tree_together(command: str, git_tree: Path, work: Path) -> None:
    proc = kvpatch(command, "--vllm", "0.10.2", "--tree", str(git_tree), cwd=work)
    assert assert_one_line_error(proc, 2) == "error: give either --vllm or --tree, not both"
    assert not (work / ".kvpatch").exists()


def test_apply_without_a_target(work: Path) -> None:
    assert_one_line_error(kvpatch("apply", cwd=work), 2, "pass --vllm X")


def test_apply_without_a_target_reuses_the_last_tree(git_tree: Path, header: Path, work: Path) -> None:
    assert kvpatch("apply", "--tree", str(git_tree), "--preset", "paper", cwd=work).returncode == 0
    assert kvpatch("revert", cwd=work).returncode == 0
    proc = kvpatch("apply", cwd=work)
    assert proc.returncode == 0 and proc.stdout.startswith(f"patched {header}"), proc.stderr
    assert header.read_text() == golden_text("default")


def test_apply_warns_about_options_and_rules_that_change_no_kernel(git_tree: Path, header: Path, work: Path) -> None:
    """Under the shipped table every tuned kernel has its own rule and everything else is off."""
    proc = kvpatch("apply", "--tree", str(git_tree), "--lookahead", "3", "--scope", "kv-head",
                   "--rule", "bf16/128/16=issue=inline", "--rule", "fp16/64/8=issue=call", cwd=work)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1, proc.stderr  # fp16/64/8 turns kernels on, and they take lookahead and scope
    assert "rule bf16/128/16 changes no kernel" in warned[0]
    proc = kvpatch("apply", "--tree", str(git_tree), "--lookahead", "3", "--cache-hint", "evict_last",
                   "--issue", "inline", cwd=work)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert [w.split(" changes")[0] for w in warned] == ["warning: --lookahead", "warning: --issue"], proc.stderr
    assert kvpatch("apply", "--tree", str(git_tree), "--fp16", "lookahead=2", cwd=work).stderr == ""


def test_tree_without_the_header(tmp_path: Path, work: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = kvpatch("apply", "--tree", str(empty), cwd=work, columns=40)
    assert_one_line_error(proc, 4, f"{empty} has no {HEADER}: not a supported vLLM tree")


def test_unpatchable_header(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "odd", fixture_text(STOCK).replace("block_idx += NUM_WARPS) {", "block_idx++) {"))
    proc = kvpatch("apply", "--tree", str(tree), cwd=work, columns=40)
    assert_one_line_error(proc, 4, "no key block loop")
    assert (tree / HEADER).read_bytes() == committed(tree)


def test_debug_shows_the_traceback(work: Path) -> None:
    proc = kvpatch("--debug", "diff", cwd=work)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "UsageError: no tree" in proc.stderr


def test_version(work: Path) -> None:
    from kvpatch import __version__

    proc = kvpatch("--version", cwd=work)
    assert (proc.returncode, proc.stdout) == (0, f"kvpatch {__version__}\n")


def test_config_command_prints_toml(work: Path) -> None:
    proc = kvpatch("config", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('[kvpatch]\npreset = "default"\nlookahead = 1\n')


def _commands() -> list[str]:
    from kvpatch.cli import app

    return sorted(c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands)


@pytest.mark.parametrize("command", _commands())
def test_every_commands_help_renders(command: str) -> None:
    """Rich reads '[...]' in help text as markup: unescaped, a bracket crashes --help
    (it did for apply's --rule). Every command's help must print, brackets and all."""
    env = {**os.environ, "COLUMNS": "250"}
    r = subprocess.run([sys.executable, "-m", "kvpatch", command, "--help"], capture_output=True, text=True,
                       env=env, timeout=60)  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-1500:]
    assert "Usage" in r.stdout
    if command == "apply":
        assert "dtype[/head[/block[/kv[/kernel]]]]" in r.stdout
