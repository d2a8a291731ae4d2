"""Edits inside kvpatch's own regions: ``apply`` and ``revert`` refuse them (exit 4, one line,
the header left as the user edited it) unless ``--force``; an injection nobody touched is
always intact; broken markers say how to get a stock header back."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import HEADER, STOCK, fixture_text

EDIT_IN_REGION = ("kvpatch_next < end_block_idx", "kvpatch_next <= end_block_idx")


def _edit_region(header: Path) -> str:
    text = header.read_text()
    assert text.count(EDIT_IN_REGION[0]) >= 1
    edited = text.replace(EDIT_IN_REGION[0], EDIT_IN_REGION[1], 1)
    header.write_text(edited)
    return edited


@pytest.mark.slow
@pytest.mark.parametrize(
    "args", [[], ["--caches", "k"], ["--preset", "paper"]], ids=["same-config", "other-config", "paper"]
)
def test_an_edit_inside_a_region_is_refused_by_apply(args: list[str], applied: Path, work: Path) -> None:
    edited = _edit_region(applied / HEADER)
    proc = run_cli("apply", "--tree", str(applied), *args, cwd=work)
    assert_one_line_error(proc, 4, "kvpatch's regions (", "were changed", "--force")
    assert (applied / HEADER).read_text() == edited
    forced = run_cli("apply", "--tree", str(applied), *args, "--force", cwd=work)
    assert forced.returncode == 0, forced.stderr
    assert EDIT_IN_REGION[1] not in (applied / HEADER).read_text()


@pytest.mark.slow
def test_the_refusal_names_the_region_edited_not_every_region(applied: Path, work: Path) -> None:
    """Before: one edited region was reported as all of them (helper, key-split, key, value)."""
    at = (applied / HEADER).read_text().index(EDIT_IN_REGION[0])
    text = _edit_region(applied / HEADER)
    label = text[text.rindex("// kvpatch:begin ", 0, at) :].split()[2]
    assert text.count("// kvpatch:begin ") > 1  # other regions stand beside it, unedited
    proc = run_cli("apply", "--tree", str(applied), "--caches", "k", cwd=work)
    assert_one_line_error(proc, 4, f"kvpatch's regions ({label}) in", "were changed")


@pytest.mark.slow
def test_an_edit_inside_a_region_is_refused_by_revert(applied: Path, work: Path) -> None:
    edited = _edit_region(applied / HEADER)
    assert_one_line_error(run_cli("revert", cwd=work), 4, "were changed", "--force")
    assert (applied / HEADER).read_text() == edited
    assert run_cli("revert", "--force", cwd=work).returncode == 0
    assert (applied / HEADER).read_text() == fixture_text(STOCK)


@pytest.mark.slow
def test_an_edited_marker_is_refused(applied: Path, work: Path) -> None:
    header = applied / HEADER
    header.write_text(
        header.read_text().replace("// kvpatch:begin key lookahead=1", "// kvpatch:begin key lookahead=2", 1)
    )
    assert_one_line_error(run_cli("apply", "--tree", str(applied), cwd=work), 4, "2 different configurations")


@pytest.mark.slow
def test_broken_markers_say_how_to_get_a_stock_header_back(applied: Path, work: Path) -> None:
    header = applied / HEADER
    header.write_text(header.read_text().replace("// kvpatch:end key\n", "", 1))
    for command in (["revert", "--force"], ["apply", "--force", "--tree", str(applied)]):
        assert_one_line_error(run_cli(*command, cwd=work), 4, "markers are broken", "git checkout")


@pytest.mark.slow
def test_an_untouched_injection_is_intact_for_every_golden(header_path: str) -> None:
    from kvpatch.config import config_from_marker, make_config
    from kvpatch.patch import inspect, patch

    for options in ({}, {"preset": "paper"}, {"caches": "k", "placement": "end"}, {"issue": "inline", "fp16": "none"},
                    {"cache_hint": "evict_first", "lookahead": 2, "size": 8192, "align": 128, "control": True}):  # fmt: skip
        cfg = make_config(**options)
        patched = patch(fixture_text(STOCK), header_path, cfg).patched
        found = inspect(patched, header_path)
        assert (found.intact, found.config, found.stock) == (True, cfg, fixture_text(STOCK))
        assert config_from_marker(cfg.marker()) == cfg
