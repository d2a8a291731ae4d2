"""``kvpatch apply`` as a user types it, on git trees made from the fixture header: what it
writes, what it prints, what it refuses. No network: every tree here is ``--tree``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, STOCK, fixture_text, git, golden_text, make_tree

from kvpatch.config import config_from_marker, make_config

pytestmark = pytest.mark.slow  # each test parses and patches the header (libclang), most of them twice


@pytest.fixture
def header(git_tree: Path) -> Path:
    return git_tree / HEADER


def committed(tree: Path) -> bytes:
    return git(tree, "show", f"HEAD:{HEADER}", text=False)


def marker_in(header: Path) -> str:
    """The configuration text of the key region's begin marker."""
    (line,) = [ln for ln in header.read_text().splitlines() if ln.strip().startswith("// kvpatch:begin key ")]
    return line.strip().removeprefix("// kvpatch:begin key ")


# --------------------------------------------------------------------------- what apply writes and prints


def test_apply_patches_and_says_what_next(git_tree: Path, header: Path, work: Path) -> None:
    proc = run_cli("apply", "--tree", str(git_tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"patched {header}"
    assert any(ln.startswith("│ key ") and "line 48" in ln and "line 50" in ln and ln.rstrip(" │").endswith("yes")
               for ln in lines)  # fmt: skip
    assert any(ln.startswith("│ value ") and "line 70" in ln and ln.rstrip(" │").endswith("yes") for ln in lines)
    (summary,) = [ln for ln in lines if ln.startswith("config: ")]
    # what the count counts is said where the count is
    assert re.match(
        r"config: \d+ of the 162 kernels vLLM builds \(bf16/fp16/fp32 x 9 head sizes x 3 block sizes x "
        r"v1/v2, auto cache\) prefetch, by \d+ rules; 'kvpatch config' prints all of it",
        summary,
    ), summary
    assert any(ln.startswith("tuned on: ") for ln in lines)  # the shipped table's machine
    assert lines[-1] == "next: kvpatch diff  |  kvpatch build --arch 9.0a  |  kvpatch revert"
    assert proc.stderr == ""
    assert header.read_text() == golden_text("default")
    assert json.loads((work / ".kvpatch/state.json").read_text())["tree"] == str(git_tree)


def test_second_apply_changes_nothing(git_tree: Path, header: Path, work: Path) -> None:
    assert run_cli("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    os.utime(header, ns=(1_000_000_000, 1_000_000_000))
    before = header.stat()
    proc = run_cli("apply", "--tree", str(git_tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == f"already applied: {header}"
    after = header.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert header.read_text() == golden_text("default")


def test_apply_another_config_replaces_the_injection(git_tree: Path, header: Path, work: Path) -> None:
    assert run_cli("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    proc = run_cli("apply", "--tree", str(git_tree), "--preset", "paper", cwd=work)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"replaced {header}"
    assert "config: the paper's patch (preset paper); 'kvpatch config --preset paper' prints it" in lines
    assert not any(ln.startswith("tuned on: ") for ln in lines)  # the paper's mechanism was never tuned
    assert header.read_text() == golden_text("paper")


def test_apply_with_a_config_file(git_tree: Path, header: Path, work: Path) -> None:
    (work / "kvpatch.toml").write_text('[kvpatch]\nplacement = "end"\nscope = "kv-head"\ninherit-rules = false\n')
    proc = run_cli("apply", "--tree", str(git_tree), "--config", "kvpatch.toml", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert header.read_text() == golden_text("placement-end-scope-kv-head")


def test_options_override_the_config_file(git_tree: Path, header: Path, work: Path) -> None:
    """The command line over the config file, and both over the shipped table's rules: every
    kernel the table leaves prefetching takes the user's lookahead."""
    (work / "kvpatch.toml").write_text('lookahead = 3\ncache-hint = "evict_last"\n')
    proc = run_cli("apply", "--tree", str(git_tree), "--config", "kvpatch.toml", "--lookahead", "2", cwd=work)
    assert proc.returncode == 0, proc.stderr
    cfg = config_from_marker(marker_in(header))
    assert (cfg.lookahead, cfg.cache_hint) == (2, "evict_last")
    assert cfg == make_config(lookahead=2, cache_hint="evict_last")
    tuned = [s for _, sel, s in cfg.kernel_variants() if sel is not None and not s.off]
    assert tuned and {s.lookahead for s in tuned} == {2}
    assert header.read_text().count(f"// kvpatch:begin key {cfg.marker()}\n") == 1


def test_apply_json(git_tree: Path, header: Path, work: Path) -> None:
    proc = run_cli("apply", "--tree", str(git_tree), "--json", "-", cwd=work)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # the JSON instead of the table: stdout holds nothing else
    assert (report["header"], report["changed"], report["previous"]) == (str(header), True, [])
    assert report["marker"] == marker_in(header) == make_config().marker()
    assert report["config"]["size"] == "auto"
    key, value = report["sites"]["key"], report["sites"]["value"]
    assert (key["line"], value["line"]) == (48, 70)
    assert report["edits"] == [
        {"offset": report["sites"]["before_function"], "length": 0, "what": "helpers"},
        {"offset": key["after_block_number"], "length": 0, "what": "key prefetch"},
        {"offset": key["before_loop"], "length": 0, "what": "key split"},
        {"offset": value["after_block_number"], "length": 0, "what": "value prefetch"},
    ]
    again = run_cli("apply", "--tree", str(git_tree), "--json", "report.json", cwd=work)
    assert again.returncode == 0 and not again.stdout.lstrip().startswith("{"), again.stderr
    saved = json.loads((work / "report.json").read_text())
    assert (saved["changed"], saved["previous"]) == (False, [report["marker"]])
    paper = json.loads(run_cli("apply", "--tree", str(git_tree), "--preset", "paper", "--json", "-", cwd=work).stdout)
    assert (paper["changed"], paper["previous"]) == (True, [report["marker"]])


def test_apply_without_a_target_reuses_the_last_tree(git_tree: Path, header: Path, work: Path) -> None:
    assert run_cli("apply", "--tree", str(git_tree), "--preset", "paper", cwd=work).returncode == 0
    assert run_cli("revert", cwd=work).returncode == 0
    proc = run_cli("apply", cwd=work)
    assert proc.returncode == 0 and proc.stdout.startswith(f"patched {header}"), proc.stderr
    assert header.read_text() == golden_text("default")


# --------------------------------------------------------------------------- local edits


def test_local_edit_is_refused(git_tree: Path, header: Path, work: Path) -> None:
    edited = "// my local note\n" + fixture_text(STOCK)
    header.write_text(edited)
    proc = run_cli("apply", "--tree", str(git_tree), cwd=work)
    assert_one_line_error(proc, 4, str(header), "local edits", "--force")
    assert header.read_text() == edited


def test_a_local_edit_that_breaks_the_patch_is_said_as_a_local_edit(git_tree: Path, header: Path, work: Path) -> None:
    """An edited header the patch cannot take (here its value loop gone, as another release's header
    in this tree would be) is refused for the edit, not as a header kvpatch cannot patch."""
    stock = fixture_text(STOCK)
    edited = stock[: stock.index("  // Iterate over the value blocks.")] + stock[stock.index("  out[") :]
    header.write_text(edited)
    proc = run_cli("apply", "--tree", str(git_tree), cwd=work)
    assert_one_line_error(proc, 4, str(header), "local edits", "--force")
    assert header.read_text() == edited
    assert_one_line_error(run_cli("apply", "--tree", str(git_tree), "--force", cwd=work), 4, "no value block loop")


def test_force_patches_keeping_the_local_edit(git_tree: Path, header: Path, work: Path) -> None:
    header.write_text("// my local note\n" + fixture_text(STOCK))
    proc = run_cli("apply", "--tree", str(git_tree), "--force", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert header.read_text() == "// my local note\n" + golden_text("default")


def test_local_edit_of_a_patched_header_is_refused(git_tree: Path, header: Path, work: Path) -> None:
    assert run_cli("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    edited = header.read_text().replace("  float acc = 0.f;", "  float acc = 1.f;")
    header.write_text(edited)
    assert_one_line_error(run_cli("apply", "--tree", str(git_tree), "--caches", "k", cwd=work), 4, "--force")
    assert header.read_text() == edited


# --------------------------------------------------------------------------- what apply says about the options


def test_apply_says_what_the_users_settings_replaced_in_the_shipped_table(git_tree: Path, work: Path) -> None:
    """A user's base setting replaces the shipped table's value at the kernels it leaves
    prefetching (a note says at how many); a user's rule decides its kernels over the table's
    more specific rules; where issue=inline reaches bf16/fp32 kernels, a warning says why."""
    proc = run_cli("apply", "--tree", str(git_tree), "--lookahead", "3", "--scope", "kv-head",
                   "--rule", "bf16/128/16=issue=inline", "--rule", "fp16/64/8=issue=call", cwd=work)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.startswith("warning:")], proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert [n.split(" replaces")[0] for n in notes] == ["note: lookahead=3", "note: scope=kv-head"], proc.stderr
    cfg = config_from_marker(marker_in(git_tree / HEADER))
    for kernel in ("v1", "v2"):  # the table's own rules there say issue=split
        assert cfg.resolve("bf16", 128, 16, "auto", kernel).issue == "inline"
    assert not cfg.resolve("fp16", 64, 8, "auto", "v1").off  # fp16/64/8 turns kernels on, with lookahead 3
    assert cfg.resolve("fp16", 64, 8, "auto", "v1").lookahead == 3

    proc = run_cli("apply", "--tree", str(git_tree), "--lookahead", "3", "--cache-hint", "evict_last",
                   "--issue", "inline", cwd=work)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note:")]
    assert [n.split(" replaces")[0] for n in notes] == ["note: lookahead=3", "note: issue=inline"], proc.stderr
    (warned,) = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warned.startswith("warning: issue=inline replaces the tuned issue at ") and "ALiBi" in warned
    assert run_cli("apply", "--tree", str(git_tree), "--fp16", "lookahead=2", cwd=work).stderr == ""


@pytest.mark.parametrize("args, needle", [
    (["--quantized", "prefetch"], "--quantized prefetch changes no kernel: every fp8-cache kernel is off"),
    (["--rule", "fp16/64/16/fp8/v1=lookahead=2"], "only fp8-cache kernels"),
    (["--rule", "fp16/64/16=lookahead=3", "--rule", "fp16/64/16/auto=lookahead=2"], "rule fp16/64/16 changes no kernel: "
                                                                                     "more specific rules decide"),
])  # fmt: skip
def test_apply_says_why_an_option_or_rule_changes_no_kernel(args: list[str], needle: str, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text())
    proc = run_cli("apply", "--tree", str(tree), *args, cwd=tmp_path)
    warned = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert proc.returncode == 0 and len(warned) == 1 and needle in warned[0], proc.stderr


def test_a_rule_for_a_kernel_vllm_never_builds_is_refused(tmp_path: Path) -> None:
    """Refused (exit 2) before anything is read or written, not a warning."""
    tree = make_tree(tmp_path / "vllm", fixture_text())
    proc = run_cli("apply", "--tree", str(tree), "--rule", "fp16/48=lookahead=2", cwd=tmp_path)
    assert_one_line_error(proc, 2, "fp16/48", "vLLM builds no kernel of head size 48")
    assert (tree / HEADER).read_text() == fixture_text() and not (tmp_path / ".kvpatch").exists()


# --------------------------------------------------------------------------- trees apply cannot patch


def test_tree_without_the_header(tmp_path: Path, work: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("apply", "--tree", str(empty), cwd=work)
    assert_one_line_error(proc, 4, f"{empty} has no {HEADER}: not a supported vLLM tree")


def test_unpatchable_header(tmp_path: Path, work: Path) -> None:
    tree = make_tree(tmp_path / "odd", fixture_text(STOCK).replace("block_idx += NUM_WARPS) {", "block_idx++) {"))
    proc = run_cli("apply", "--tree", str(tree), cwd=work)
    assert_one_line_error(proc, 4, "no key block loop")
    assert (tree / HEADER).read_bytes() == committed(tree)
