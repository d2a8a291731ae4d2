"""kvpatch.patch.plan: the emitted CUDA, shown literally (golden files), and the edit algebra.

The golden files under tests/fixtures/golden/ are the diffs the fixture header gets from
each configuration below; read them to see exactly what kvpatch injects. After a deliberate
change to the templates, regenerate them with

    KVPATCH_REGEN_GOLDEN=1 pytest tests/patch/test_edits.py

and review the diff of tests/fixtures/golden/ before committing it.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import pytest
from conftest import GOLDEN, STOCK, fixture_text, golden_text, make_tree

from kvpatch.commands import apply as apply_command
from kvpatch.config import make_config
from kvpatch.errors import PatchError, UsageError
from kvpatch.patch import Edit, apply, find_sites, patch, plan, unpatch
from kvpatch.source.releases import HEADER
from kvpatch.source.workspace import unified_diff

#: the module that renders the templates (``kvpatch.patch.plan``, the attribute, is its function)
planning = importlib.import_module("kvpatch.patch.plan")

#: golden file name -> configuration options. Only "default" carries the shipped rule table;
#: the others are uniform (no rules), so each shows its own option's effect on the template.
_UNIFORM = {"inherit_rules": False}
CONFIGS: dict[str, dict] = {
    "default": {},
    "paper": {"preset": "paper"},
    "caches-k": {"caches": "k", **_UNIFORM},
    "lookahead2-size8192-align128": {"lookahead": 2, "size": 8192, "align": 128, **_UNIFORM},
    "evict-last": {"cache_hint": "evict_last", **_UNIFORM},
    "placement-end-scope-kv-head": {"placement": "end", "scope": "kv-head", **_UNIFORM},
    "control": {"control": True, **_UNIFORM},
    "issue-call-evict-first": {"issue": "call", "cache_hint": "evict_first", **_UNIFORM},
    "min-group-2": {"min_group": 2, **_UNIFORM},
    "min-ctas-1024-inline": {"min_ctas": 1024, "issue": "inline", **_UNIFORM},
    "read-warp-kv-head-min-group-2": {
        "read": "warp",
        "scope": "kv-head",
        "min_group": 2,
        "issue": "inline",
        **_UNIFORM,
    },
    "min-kv-mib-64-call-kv-head": {"min_kv_mib": 64, "scope": "kv-head", "read": "warp", **_UNIFORM},
    "kv-head-rotate-min-group-2": {"scope": "kv-head-rotate", "min_group": 2, **_UNIFORM},
}

REGEN = os.environ.get("KVPATCH_REGEN_GOLDEN") == "1"


@pytest.fixture(scope="module")
def stock() -> str:
    return fixture_text(STOCK)


# --------------------------------------------------------------------------- golden files


@pytest.mark.parametrize("name", CONFIGS)
def test_golden(name: str, stock: str, header_path: str) -> None:
    """Each golden file is the diff (before -> after) the fixture gets from one configuration."""
    result = patch(stock, header_path, make_config(**CONFIGS[name]))
    diff = unified_diff(stock, result.patched, HEADER)
    golden = GOLDEN / f"{name}.diff"
    if REGEN:
        golden.write_text(diff, encoding="utf-8")
        pytest.skip(f"regenerated {golden.name}: review it with git diff")
    assert diff == golden.read_text(encoding="utf-8")
    assert result.patched == golden_text(name)
    assert result.stock == stock
    assert result.previous == ()


def test_a_rule_table_injection_reads_as_expected(stock: str, header_path: str) -> None:
    """The key-loop injection of a table shaped like the shipped default, spelled out
    (before -> after): quantized caches get none; the most specific rule comes first and
    a kernel part tests PARTITION_SIZE (0 in v1); a dtype ``off`` rule catches the rest
    of that dtype; the base settings (call the helper) serve the others."""
    cfg = make_config(inherit_rules=False, fp16="off",
                      rules={"fp16/128/16/auto/v2": "issue=inline,lookahead=2", "fp16/128/16/auto/v1": "off"})  # fmt: skip
    before = (
        "    const int64_t physical_block_number =\n"
        "        static_cast<int64_t>(block_table[block_idx]);\n"
        "\n"
        "    for (int i = 0; i < BLOCK_SIZE / WARP_SIZE + 1; i++) {\n"
    )
    after = (
        "    const int64_t physical_block_number =\n"
        "        static_cast<int64_t>(block_table[block_idx]);\n"
        "    // kvpatch:begin key lookahead=1 size=auto align=16 caches=kv hint=none placement=start scope=cta issue=call quantized=skip fp16:off fp16/128/16/auto/v1:off fp16/128/16/auto/v2:lookahead=2,issue=inline\n"
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && __CUDA_ARCH__ < 1000 && !defined(USE_ROCM)\n"
        "    if constexpr (kvpatch_is_same<cache_t, scalar_t>::value) {\n"
        "      if constexpr (kvpatch_is_same<scalar_t, uint16_t>::value && HEAD_SIZE == 128 && BLOCK_SIZE == 16 && kvpatch_is_same<cache_t, scalar_t>::value && PARTITION_SIZE == 0) {\n"
        "        // off: no prefetch, these kernels compile as stock\n"
        "      } else if constexpr (kvpatch_is_same<scalar_t, uint16_t>::value && HEAD_SIZE == 128 && BLOCK_SIZE == 16 && kvpatch_is_same<cache_t, scalar_t>::value && PARTITION_SIZE != 0) {\n"
        "        {\n"
        "          const int kvpatch_next = block_idx + 2 * NUM_WARPS;\n"
        "          if (lane == 0 && kvpatch_next < end_block_idx) {\n"
        "            const int64_t kvpatch_block = static_cast<int64_t>(block_table[kvpatch_next]);\n"
        "            {\n"
        "              const cache_t* kvpatch_tile = k_cache + kvpatch_block * kv_block_stride + kv_head_idx * kv_head_stride;\n"
        '              asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(reinterpret_cast<unsigned long long>(kvpatch_tile) & ~0xfULL), "n"(BLOCK_SIZE * HEAD_SIZE * sizeof(cache_t)));\n'
        "            }\n"
        "          }\n"
        "        }\n"
        "      } else if constexpr (kvpatch_is_same<scalar_t, uint16_t>::value) {\n"
        "        // off: no prefetch, these kernels compile as stock\n"
        "      } else {\n"
        "        {\n"
        "          const int kvpatch_next = block_idx + 1 * NUM_WARPS;\n"
        "          if (lane == 0 && kvpatch_next < end_block_idx) {\n"
        "            const int64_t kvpatch_block = static_cast<int64_t>(block_table[kvpatch_next]);\n"
        "            {\n"
        "              const cache_t* kvpatch_tile = k_cache + kvpatch_block * kv_block_stride + kv_head_idx * kv_head_stride;\n"
        "              kvpatch_prefetch_l2<BLOCK_SIZE * HEAD_SIZE * sizeof(cache_t)>(kvpatch_tile);\n"
        "            }\n"
        "          }\n"
        "        }\n"
        "      }\n"
        "    }\n"
        "#endif\n"
        "    // kvpatch:end key\n"
        "\n"
        "    for (int i = 0; i < BLOCK_SIZE / WARP_SIZE + 1; i++) {\n"
    )
    assert stock.count(before) == 1
    assert patch(stock, header_path, cfg).patched.count(after) == 1
    # the shipped default has this shape: per-kernel rules first, then the dtype "off" rules
    default = golden_text("default")
    assert default.count("PARTITION_SIZE == 0") >= 2 and "kvpatch_is_same<scalar_t, float>::value) {" in default


def test_goldens_differ_from_each_other() -> None:
    texts = {name: golden_text(name) for name in CONFIGS}
    assert len(set(texts.values())) == len(CONFIGS)


# --------------------------------------------------------------------------- idempotence, replacing, stripping


@pytest.mark.parametrize("name", CONFIGS)
def test_patching_a_patched_header_changes_nothing(name: str, header_path: str) -> None:
    cfg = make_config(**CONFIGS[name])
    result = patch(golden_text(name), header_path, cfg)
    assert result.patched == golden_text(name)
    assert result.previous == (cfg.marker(),)


@pytest.mark.parametrize(
    "first, second",
    [
        ("default", "paper"),
        ("paper", "default"),
        ("caches-k", "placement-end-scope-kv-head"),
        ("evict-last", "control"),
        ("lookahead2-size8192-align128", "caches-k"),
    ],
)
def test_patching_with_another_config_replaces_the_injection(first: str, second: str, header_path: str) -> None:
    result = patch(golden_text(first), header_path, make_config(**CONFIGS[second]))
    assert result.patched == golden_text(second)
    assert result.previous == (make_config(**CONFIGS[first]).marker(),)


@pytest.mark.parametrize("name", CONFIGS)
def test_unpatch_restores_stock_byte_for_byte(name: str, stock: str, header_path: str) -> None:
    restored, markers = unpatch(golden_text(name), header_path)
    assert restored.encode() == stock.encode()
    assert markers == (make_config(**CONFIGS[name]).marker(),)


def test_unpatch_of_stock_is_a_no_op(stock: str, header_path: str) -> None:
    assert unpatch(stock, header_path) == (stock, ())


def test_unterminated_marker_is_refused(header_path: str) -> None:
    broken = golden_text("default").replace("    // kvpatch:end key\n", "", 1)
    with pytest.raises(PatchError, match="kvpatch"):
        unpatch(broken, header_path)


# --------------------------------------------------------------------------- apply()


def test_apply_edits_given_in_any_order() -> None:
    text = "int a = 1;\nint b = 2;\nint c = 3;\n"
    es = [
        Edit(0, 0, "// top\n", "top"),
        Edit(text.index("2"), 1, "20", "b"),
        Edit(len(text), 0, "// end\n", "end"),
        Edit(text.index("1"), 1, "10", "a"),
    ]
    expected = "// top\nint a = 10;\nint b = 20;\nint c = 3;\n// end\n"
    assert apply(text, es) == expected
    assert apply(text, list(reversed(es))) == expected
    assert apply(text.encode(), es) == expected


def test_apply_takes_byte_offsets() -> None:
    text = "é = 1;"  # 'é' is two bytes in UTF-8
    assert apply(text, [Edit(2, 0, "x")]) == "éx = 1;"
    assert apply(text, [Edit(0, 2, "e")]) == "e = 1;"


def test_apply_allows_an_insertion_where_a_deletion_ends() -> None:
    assert apply("abcdef", [Edit(1, 2, ""), Edit(3, 0, "X")]) == "aXdef"
    assert apply("abcdef", [Edit(3, 0, "X"), Edit(3, 2, "")]) == "abcXf"


@pytest.mark.parametrize(
    "es",
    [
        [Edit(1, 3, "", "first"), Edit(2, 0, "x", "second")],  # insertion inside a deletion
        [Edit(1, 3, "", "first"), Edit(3, 2, "", "second")],  # two deletions that overlap
        [Edit(2, 0, "x", "first"), Edit(2, 0, "y", "second")],  # two insertions at one offset
    ],
    ids=["insertion-inside-deletion", "deletions-overlap", "insertions-at-one-offset"],
)
def test_apply_refuses_overlapping_edits(es: list[Edit]) -> None:
    with pytest.raises(PatchError, match=r"overlapping edits at byte \d+: 'first' and 'second'"):
        apply("abcdef", es)


@pytest.mark.parametrize("edit", [Edit(7, 0, "x"), Edit(4, 3, "")])
def test_apply_refuses_edits_outside_the_text(edit: Edit) -> None:
    with pytest.raises(PatchError, match="outside the text"):
        apply("abcdef", [edit])


@pytest.mark.parametrize("fields", [(-1, 0, "x"), (5, -3, "X"), (1.0, 0, "X"), (True, 0, "X"), (1, 0, None),
                                    (1, 0, b"x")])  # fmt: skip
def test_an_edit_that_cannot_be_applied_is_refused_when_it_is_made(fields: tuple) -> None:
    """Before: Edit(5, -3, "X") applied to "abcdefgh" gave "abcdeXcdefgh" (a negative length
    copied bytes); a float offset or None text failed deep in apply. After: a UsageError."""
    with pytest.raises(UsageError, match="an edit's"):
        Edit(*fields)


@pytest.mark.parametrize("data, edits, error, message", [
    ("é", [Edit(1, 0, "x")], PatchError, "splits a character"),  # inside 'é' (two bytes)
    ("é!", [Edit(0, 1, "e")], PatchError, "splits a character"),  # ends inside it
    (b"\xff", [], UsageError, "not UTF-8"),
    ("a\udcff", [], UsageError, "not UTF-8"),  # a lone surrogate: no UTF-8 at all
    (None, [], UsageError, "takes text"),
    ("ab", [(1, 0, "x")], UsageError, "a list of Edit"),
    ("ab", None, UsageError, "a list of Edit"),
])  # fmt: skip
def test_apply_refuses_text_and_edits_it_cannot_apply(data, edits, error, message) -> None:
    with pytest.raises(error, match=message):
        apply(data, edits)


def test_plan_is_insertions_at_the_site_offsets(stock: str, header_path: str) -> None:
    sites = find_sites(stock, header_path)
    helpers, *es = plan(sites, make_config())
    assert (helpers.offset, helpers.length, helpers.what) == (sites.before_function, 0, "helpers")
    assert helpers.text.startswith("\n// kvpatch:begin helper ")
    assert [(e.offset, e.length, e.what) for e in es] == [
        (sites.key.after_block_number, 0, "key prefetch"),
        (sites.key.before_loop, 0, "key split"),  # the shipped table splits bf16 block 16
        (sites.value.after_block_number, 0, "value prefetch"),
    ]
    key, split, value = es
    assert all(e.text.startswith("\n    // kvpatch:begin ") for e in (key, value))
    assert split.text.startswith("\n  // kvpatch:begin key-split ")  # before the loop, at the loop's indent
    assert apply(stock, [helpers, *es]) == golden_text("default")
    # From the end backwards, a later edit does not move an earlier one's offset ...
    assert apply(apply(apply(apply(stock, [value]), [key]), [split]), [helpers]) == golden_text("default")
    # ... from the front, it does: the value insertion lands inside the key loop's injection.
    assert apply(apply(apply(stock, [helpers]), [key]), [value]) != golden_text("default")


def test_plan_for_the_paper_preset(stock: str, header_path: str) -> None:
    sites = find_sites(stock, header_path)
    es = plan(sites, make_config(preset="paper"))
    assert [(e.offset, e.what) for e in es] == [
        (sites.key.after_block_number, "key next block"),
        (sites.key.inner_open, "key prefetch"),
        (sites.value.after_block_number, "value next block"),
        (sites.value.inner_open, "value prefetch"),
    ]


# --------------------------------------------------------------------------- non-ASCII text


def test_non_ascii_text_before_the_sites(header_path: str) -> None:
    """Offsets are byte offsets: multi-byte characters before the loops must not shift the edits."""
    anchor = "namespace vllm {\n"
    note = "// Ünïcödé — ✓ 名前 (multi-byte characters before both loops)\n"
    stock = fixture_text().replace(anchor, note + anchor)
    sites = find_sites(stock, header_path)
    data = stock.encode()
    assert data[: sites.key.after_block_number].endswith(b"static_cast<int64_t>(block_table[block_idx]);")
    for name in ("default", "paper"):
        result = patch(stock, header_path, make_config(**CONFIGS[name]))
        assert result.patched == golden_text(name).replace(anchor, note + anchor)
        assert unpatch(result.patched, header_path)[0] == stock


# --------------------------------------------------------------------------- trailing comments


@pytest.mark.parametrize(
    "name, old, new",
    [
        (
            "default",
            "static_cast<int64_t>(block_table[block_idx]);\n\n",
            "static_cast<int64_t>(block_table[block_idx]);  // widened: no overflow\n\n",
        ),
        (
            "placement-end-scope-kv-head",
            "                : 0;\n    }\n  }\n\n  float acc",
            "                : 0;\n    }  // tokens\n  }\n\n  float acc",
        ),
        (
            "paper",
            "for (int j = 0; j < HEAD_SIZE / x; j++) {\n",
            "for (int j = 0; j < HEAD_SIZE / x; j++) {  // vectors\n",
        ),
    ],
    ids=["after-block-number", "end-of-body", "paper-inner-brace"],
)
def test_trailing_comment_at_the_insertion_point(name: str, old: str, new: str, header_path: str) -> None:
    stock = fixture_text()
    assert stock.count(old) == 1
    stock = stock.replace(old, new)
    cfg = make_config(**CONFIGS[name])
    patched = patch(stock, header_path, cfg).patched
    assert patch(patched, header_path, cfg).patched == patched
    assert unpatch(patched, header_path)[0] == stock


@pytest.mark.parametrize(
    "name, old, new, crlf",
    [
        ("default", "block_table[block_idx]);\n\n", "block_table[block_idx]); \t\n\n", False),
        ("default", "block_table[block_idx]);\n\n", "block_table[block_idx]); /* c */ \n\n", False),
        ("default", "block_table[block_idx]);\n\n", "block_table[block_idx]);  \n\n", True),
        ("placement-end-scope-kv-head", "                : 0;\n    }\n  }\n\n  float acc",
         "                : 0;\n    }  \n  }\n\n  float acc", False),
        ("paper", "for (int j = 0; j < HEAD_SIZE / x; j++) {\n", "for (int j = 0; j < HEAD_SIZE / x; j++) { \n", False),
    ],
    ids=["after-block-number", "after-a-block-comment", "crlf", "end-of-body", "paper-inner-brace"],
)  # fmt: skip
def test_trailing_blanks_at_the_insertion_point_stay_on_their_line(name: str, old: str, new: str, crlf: bool,
                                                                   header_path: str) -> None:  # fmt: skip
    """Blanks after the statement kvpatch inserts after stay where they were: before, they ended up
    after the region's end marker, whose comment runs to the line's end, so that a second apply
    found its region changed (exit 4) and a revert took the blanks with it."""
    stock = fixture_text()
    assert stock.count(old) == 1
    stock = stock.replace(old, new)
    line = new.split("\n")[0] + "\n"
    if crlf:
        stock, line = stock.replace("\n", "\r\n"), line.replace("\n", "\r\n")
    cfg = make_config(**CONFIGS[name])
    patched = patch(stock, header_path, cfg).patched
    assert line in patched  # the statement's line, its blanks and its end, whole
    assert patch(patched, header_path, cfg).patched == patched
    assert unpatch(patched, header_path)[0] == stock


def test_blanks_after_an_end_marker_are_the_headers_own(header_path: str) -> None:
    """A header patched with blanks after a region's end marker (as kvpatch wrote them before it
    kept them on the statement's line) reverts with the blanks in place: the region ends at its
    marker's text, not at the end of the marker's line."""
    stock = fixture_text()
    patched = patch(stock, header_path, make_config(**CONFIGS["default"])).patched
    assert patched.count("// kvpatch:end key\n") == 1
    written_before = patched.replace("// kvpatch:end key\n", "// kvpatch:end key \t\n")
    blanks_kept = stock.replace("block_table[block_idx]);\n\n", "block_table[block_idx]); \t\n\n")
    assert unpatch(written_before, header_path)[0] == blanks_kept


# --------------------------------------------------------------------------- validation


def _broken_render(real, pattern: str, replacement: str):
    def render(name: str, **context) -> str:
        text = real(name, **context)
        if name == "inject/prefetch_helper.cuh.j2":  # the trait region has no prefetch to break
            return text
        broken = re.sub(pattern, replacement, text)
        assert broken != text
        return broken

    return render


@pytest.mark.parametrize(
    "pattern, replacement, message",
    [
        # a typo in the generated code: a new diagnostic on re-parse
        (r"\(kvpatch_tile\)", "(kvpatch_tilee)", "the patched header has new diagnostics: .*kvpatch_tilee"),
        # valid code, but the asm statement went missing
        (r"asm volatile\(.*\);", "(void)kvpatch_tile;", "after patching, the key loop lacks the prefetch"),
    ],
    ids=["new-diagnostic", "asm-missing"],
)
def test_validation_failure_raises_and_writes_nothing(
    pattern: str, replacement: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = make_tree(tmp_path / "vllm", fixture_text())
    before = (tree / HEADER).read_bytes()
    monkeypatch.setattr(planning, "render", _broken_render(planning.render, pattern, replacement))
    # issue=inline, no shipped table: one asm per loop, no helper call
    opts = apply_command.ApplyOptions(tree=tree, cwd=tmp_path, settings={"issue": "inline"}, untuned=True)
    with pytest.raises(PatchError, match=message):
        apply_command.run(opts)
    assert (tree / HEADER).read_bytes() == before
    assert sorted(p.name for p in (tree / HEADER).parent.iterdir()) == ["attention_kernels.cuh"]
    assert [p.name for p in (tmp_path / ".kvpatch").iterdir()] == ["lock"]  # the workspace lock, no state
