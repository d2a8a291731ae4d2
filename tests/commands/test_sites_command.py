"""``kvpatch sites``: where the key and value loops are (in the stock text, patched or not),
and what kvpatch injected at each; as a table, or as JSON with ``--json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER

pytestmark = pytest.mark.slow  # each test parses the header (libclang)


def _row(lines: list[str], kind: str) -> str:
    (row,) = [line for line in lines if line.lstrip("│ ").startswith(kind + " ")]
    return row


def test_sites_json(git_tree: Path, work: Path) -> None:
    proc = run_cli("sites", "--tree", str(git_tree), "--json", "-", cwd=work)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["header"] == str(git_tree / HEADER)
    assert (found["lane_var"], found["cache_type"], found["head_var"], found["queries_per_kv_var"]) == (
        "lane", "cache_t", "head_idx", "num_queries_per_kv",
    )  # fmt: skip
    assert (found["key"]["line"], found["key"]["block_number_line"], found["key"]["cache_param"]) == (48, 50, "k_cache")
    assert (found["value"]["line"], found["value"]["block_number_line"], found["value"]["cache_param"]) == (
        70,
        72,
        "v_cache",
    )
    assert found["key"]["head_offset_expr"] == "kv_head_idx * kv_head_stride"
    assert run_cli("sites", "--tree", str(git_tree), "--json", "sites.json", cwd=work).returncode == 0
    assert json.loads((work / "sites.json").read_text()) == found


def test_sites_of_a_patched_tree_are_those_of_its_stock_header(git_tree: Path, work: Path) -> None:
    stock = json.loads(run_cli("sites", "--tree", str(git_tree), "--json", "-", cwd=work).stdout)
    assert (stock.pop("injected"), stock.pop("injection_intact")) == ({"key": None, "value": None}, True)
    applied = run_cli("apply", "--tree", str(git_tree), "--caches", "k", "--json", "-", cwd=work)
    assert applied.returncode == 0, applied.stderr
    marker = json.loads(applied.stdout)["marker"]
    assert " caches=k " in f" {marker} "
    patched = json.loads(run_cli("sites", "--json", "-", cwd=work).stdout)
    assert (patched.pop("injected"), patched.pop("injection_intact")) == ({"key": marker, "value": None}, True)
    assert patched == stock


def test_sites_table_shows_what_is_injected_at_each_site(git_tree: Path, work: Path) -> None:
    lines = run_cli("sites", "--tree", str(git_tree), cwd=work).stdout.splitlines()
    assert _row(lines, "key").rstrip(" │").endswith("no") and _row(lines, "value").rstrip(" │").endswith("no")
    assert run_cli("apply", "--tree", str(git_tree), "--caches", "v", "--lookahead", "3", cwd=work).returncode == 0
    lines = run_cli("sites", cwd=work).stdout.splitlines()
    assert _row(lines, "key").rstrip(" │").endswith("no")
    assert _row(lines, "value").rstrip(" │").endswith("yes")


def test_sites_table(git_tree: Path, work: Path) -> None:
    proc = run_cli("sites", "--tree", str(git_tree), cwd=work)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{git_tree / HEADER}: paged_attention_kernel at line 14"
    value = _row(lines, "value")
    assert "line 70" in value and "line 72" in value and "block_idx += NUM_WARPS" in value and "v_cache[...]" in value
    assert (git_tree / ".kvpatch").exists() is False and not (work / ".kvpatch").exists()  # sites changes nothing


def test_sites_warns_when_the_regions_were_edited(git_tree: Path, work: Path) -> None:
    assert run_cli("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    header = git_tree / HEADER
    header.write_text(header.read_text().replace("kvpatch_next < end_block_idx", "kvpatch_next <= end_block_idx", 1))
    proc = run_cli("sites", cwd=work)
    assert proc.returncode == 0, proc.stderr
    # the fixture's first such comparison is the key loop's prefetch: that region is named, not all four
    assert proc.stderr.strip() == "warning: kvpatch's regions (key) were changed after kvpatch wrote them"
    report = json.loads(run_cli("sites", "--json", "-", cwd=work).stdout)
    assert report["injection_intact"] is False and report["injection_changed"] == ["key"]


def test_sites_and_vllm_and_tree_together(git_tree: Path, work: Path) -> None:
    proc = run_cli("sites", "--vllm", "0.10.2", "--tree", str(git_tree), cwd=work)
    assert assert_one_line_error(proc, 2) == "error: kvpatch sites: give either --vllm or --tree, not both"


def test_a_region_moved_whole_is_not_an_edit_of_no_region(git_tree: Path, work: Path) -> None:
    """A region moved down a line, its text untouched: no region differs from its rendering, but
    the injection is not kvpatch's; the warning names every region (before: "regions ()")."""
    assert run_cli("apply", "--tree", str(git_tree), cwd=work).returncode == 0
    header = git_tree / HEADER
    text = header.read_text()
    begin = text.index("// kvpatch:begin value")
    begin = text.rindex("\n", 0, begin) + 1
    end = text.index("// kvpatch:end value")
    end = text.index("\n", end) + 1
    rest = text[:begin] + text[end:]
    after = rest.index("\n", begin) + 1  # one stock line down
    header.write_text(rest[:after] + text[begin:end] + rest[after:])
    proc = run_cli("sites", cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == (
        "warning: kvpatch's regions (helper, key-split, key, value) were changed after kvpatch wrote them"
    )
