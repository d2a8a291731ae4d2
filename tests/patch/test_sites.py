"""kvpatch.patch.sites on the fixture headers: the names and offsets read off the AST."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import LOOP_NAMES, REFORMATTED, STOCK, fixture_text, golden_text
from patch_helpers import injected_regions

from kvpatch.config import make_config
from kvpatch.errors import PatchError
from kvpatch.patch import Sites, find_sites, injections, patch, patch_header, plan, unpatch

#: What every fixture header must give, whatever its layout.
KERNEL_NAMES = {
    "cache_type": "cache_t",
    "head_size_param": "HEAD_SIZE",
    "block_size_param": "BLOCK_SIZE",
    "lane_var": "lane",
    "head_var": "head_idx",
    "queries_per_kv_var": "num_queries_per_kv",
}
SITE_NAMES = {
    "key": {**LOOP_NAMES, "kind": "key", "cache_param": "k_cache", "inner_var": "j"},
    "value": {**LOOP_NAMES, "kind": "value", "cache_param": "v_cache", "inner_var": "i"},
}


def names(sites: Sites) -> dict:
    """Everything in ``sites`` that does not depend on layout (no lines, offsets, indents)."""
    layout = {"line", "block_number_line", "after_block_number", "body_indent", "body_last_end",
              "inner_open", "inner_indent", "loop_start", "loop_end", "before_loop", "loop_indent",
              "loop_text"}  # fmt: skip
    out = {k: getattr(sites, k) for k in KERNEL_NAMES}
    for site in sites:
        out[site.kind] = {k: v for k, v in dataclasses.asdict(site).items() if k not in layout}
    return out


def line_of(text: str, needle: str, nth: int = 0) -> int:
    """1-based line of the ``nth`` occurrence of ``needle``."""
    at = -1
    for _ in range(nth + 1):
        at = text.index(needle, at + 1)
    return text.count("\n", 0, at) + 1


@pytest.fixture(scope="module", params=[STOCK, REFORMATTED])
def fixture(request: pytest.FixtureRequest, header_path: str) -> tuple[str, Sites]:
    text = fixture_text(request.param)
    return text, find_sites(text, header_path)


# --------------------------------------------------------------------------- names


def test_names_of_the_stock_fixture(header_path: str) -> None:
    text = fixture_text(STOCK)
    sites = find_sites(text, header_path)
    assert names(sites) == {**KERNEL_NAMES, **SITE_NAMES}
    assert sites.function_line == line_of(text, "template <typename scalar_t")
    assert (sites.key.line, sites.key.block_number_line) == (48, 50)
    assert (sites.value.line, sites.value.block_number_line) == (70, 72)
    assert (sites.key.body_indent, sites.key.inner_indent) == ("    ", "        ")
    assert (sites.value.body_indent, sites.value.inner_indent) == ("    ", "      ")


def test_reformatted_fixture_gives_the_same_names(header_path: str) -> None:
    """Allman braces, tabs, line breaks and comments inside statements, blank lines."""
    stock = find_sites(fixture_text(STOCK), header_path)
    reformatted = find_sites(fixture_text(REFORMATTED), header_path)
    assert names(reformatted) == names(stock)
    assert (reformatted.key.body_indent, reformatted.value.body_indent) == ("        ", "\t")


def test_lines_and_offsets_point_at_the_code(fixture: tuple[str, Sites]) -> None:
    text, sites = fixture
    data = text.encode()
    for nth, site in enumerate(sites):
        assert site.line == line_of(text, "for (int block_idx", nth)
        # the whole for statement, and the line break before its own line (issue=split)
        assert (
            data[site.loop_start :].startswith(b"for (int block_idx")
            and data[site.loop_end - 1 : site.loop_end] == b"}"
        )
        assert site.loop_text == data[site.loop_start : site.loop_end].decode()
        assert data[site.before_loop : site.loop_start] == b"\n" + site.loop_indent.encode()
        assert site.block_number_line == line_of(text, "const int64_t physical_block_number", nth)
        # just past the ';' of the block-number declaration
        before = data[: site.after_block_number]
        assert before.endswith(b";")
        assert before.rsplit(b"const int64_t physical_block_number", 1)[1].rstrip(b";").rstrip().endswith(b"])")
        # just past the '{' of the inner loop that reads the tile
        inner_head = data[: site.inner_open].rsplit(b"for (", 1)[1]
        assert inner_head.startswith(f"int {site.inner_var} = 0;".encode()) and inner_head.endswith(b"{")
        # just past the loop body's last statement: only whitespace, then the loop's '}'
        assert data[: site.body_last_end].endswith(b"}")
        assert data[site.body_last_end :].lstrip().startswith(b"}")
        assert data[site.after_block_number : site.body_last_end].count(b"{") == data[
            site.after_block_number : site.body_last_end
        ].count(b"}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "golden, options",
    [("default", {}), ("paper", {"preset": "paper"}),
     ("placement-end-scope-kv-head", {"placement": "end", "scope": "kv-head", "inherit_rules": False})],
)  # fmt: skip
def test_reformatted_fixture_gets_the_golden_injection_and_round_trips(
    golden: str, options: dict, header_path: str
) -> None:
    """Laid out differently, the header gets what the golden file shows, line for line at its
    own indentation (issue=split's copy of the key loop is its own loop); patching again
    changes nothing and stripping gives the header back byte for byte."""
    text = fixture_text(REFORMATTED)
    cfg = make_config(**options)
    patched = patch(text, header_path, cfg).patched
    sites = find_sites(text, header_path)
    stock_loop = find_sites(fixture_text(STOCK), header_path).key.loop_text
    assert injected_regions(patched, sites.key.loop_text) == injected_regions(golden_text(golden), stock_loop)
    begin = "// kvpatch:begin key " if cfg.preset != "paper" else "// kvpatch:begin key-next "
    assert f"\n{sites.key.body_indent}{begin}" in patched
    assert patch(patched, header_path, cfg).patched == patched
    assert unpatch(patched, header_path) == (text, (cfg.marker(),))


# --------------------------------------------------------------------------- shapes kvpatch refuses


def _without_value_loop(text: str) -> str:
    start = text.index("  // Iterate over the value blocks.")
    end = text.index("  out[")
    return text[:start] + text[end:]


SHAPES = {
    "no function": (
        lambda t: t.replace("paged_attention_kernel(", "paged_attention_kernel_v0("),
        r"^paged_attention_kernel \(a function template\) not found in the header$",
    ),
    "two definitions": (
        lambda t: t + "\nnamespace again {\n" + t[t.index("template <") : t.rindex("}  // namespace vllm")] + "}\n",
        r"^2 definitions of paged_attention_kernel \(lines \d+, \d+\): vLLM's header has one$",
    ),
    "value loop missing": (
        _without_value_loop,
        r"^no value block loop \(.*reading v_cache through <table>\[<var>\]\) found in paged_attention_kernel$",
    ),
    "increment ++": (
        lambda t: t.replace("block_idx += NUM_WARPS) {", "block_idx++) {", 1),
        r"^no key block loop \('for \(\.\.\. ; <var> < <end>; <var> \+= <stride>\)'",
    ),
    "no block-number declaration": (
        lambda t: t.replace(
            "    const int64_t physical_block_number =\n        static_cast<int64_t>(block_table[block_idx]);\n",
            "",
            1,
        ).replace(
            "k_cache + physical_block_number * kv_block_stride",
            "k_cache + static_cast<int64_t>(block_table[block_idx]) * kv_block_stride",
            1,
        ),
        r"^no key block loop ",
    ),  # fmt: skip
    "no lane variable": (
        lambda t: t.replace(
            "const int lane = thread_idx % WARP_SIZE;", "const int lane = thread_idx & (WARP_SIZE - 1);"
        ),
        r"^no lane variable \('\.\.\. % WARP_SIZE'\) in paged_attention_kernel$",
    ),
    "no HEAD_SIZE template parameter": (
        lambda t: t.replace("HEAD_SIZE", "HEAD_DIM"),
        r"^paged_attention_kernel has no template parameter HEAD_SIZE$",
    ),
    "no k_cache parameter": (
        lambda t: t.replace("k_cache", "key_cache"),
        r"^paged_attention_kernel has no parameter k_cache$",
    ),
    "two value loops": (
        lambda t: t.replace(
            "  out[",
            "  for (int block_idx = start_block_idx; block_idx < end_block_idx; block_idx += NUM_WARPS) {\n"
            "    const int64_t b = block_table[block_idx];\n"
            "    acc += static_cast<float>(v_cache[b * kv_block_stride + kv_head_idx * kv_head_stride]);\n"
            "  }\n  out[",
        ),
        r"^2 value block loop ",
    ),  # fmt: skip
}


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes_that_do_not_fit_raise_patch_error(shape: str, header_path: str) -> None:
    change, message = SHAPES[shape]
    stock = fixture_text()
    text = change(stock)
    assert text != stock
    with pytest.raises(PatchError, match=message) as info:
        find_sites(text, header_path)
    assert info.value.exit_code == 4


def test_key_loop_after_value_loop_is_refused(header_path: str) -> None:
    stock = fixture_text()
    key_start = stock.index("  // Iterate over the key blocks")
    value_start = stock.index("  float acc = 0.f;")
    end = stock.index("  out[")
    swapped = stock[:key_start] + stock[value_start:end] + stock[key_start:value_start] + stock[end:]
    with pytest.raises(PatchError, match="^the key loop does not come before the value loop$"):
        find_sites(swapped, header_path)


# --------------------------------------------------------------------------- known bugs


def test_comment_before_an_operator(header_path: str) -> None:
    text = fixture_text().replace(
        "            k_cache + physical_block_number * kv_block_stride +\n",
        "            k_cache  // the key cache\n            + physical_block_number * kv_block_stride +\n",
    )
    assert text != fixture_text()
    sites = find_sites(text, header_path)
    assert names(sites) == {**KERNEL_NAMES, **SITE_NAMES}


@pytest.mark.parametrize(
    "new",
    [
        "            kv_head_idx *\n                kv_head_stride + physical_block_offset * x;\n",
        "            kv_head_idx /* kv head */ * kv_head_stride + physical_block_offset * x;\n",
    ],
    ids=["line-break", "comment"],
)
def test_line_break_or_comment_inside_the_head_offset(new: str, header_path: str) -> None:
    text = fixture_text().replace("            kv_head_idx * kv_head_stride + physical_block_offset * x;\n", new)
    assert text != fixture_text()
    sites = find_sites(text, header_path)
    assert sites.key.head_offset_expr == "kv_head_idx * kv_head_stride"


def test_gqa_names_when_the_head_index_is_itself_a_quotient(header_path: str) -> None:
    text = fixture_text().replace(
        "  const int head_idx = blockIdx.x;\n  const int num_heads = gridDim.x;\n",
        "  const int num_heads = gridDim.x;\n  const int flat_idx = blockIdx.x;\n"
        "  const int num_seqs = gridDim.y;\n  const int head_idx = flat_idx / num_seqs;\n",
    )
    assert text != fixture_text()
    sites = find_sites(text, header_path)
    assert (sites.head_var, sites.queries_per_kv_var) == ("head_idx", "num_queries_per_kv")


@pytest.mark.parametrize("terms", [3, 2000])
def test_a_sum_of_thousands_of_terms_in_a_loop_is_read_once_and_the_sites_stay(terms: int, header_path: str) -> None:
    """Before: each nested '+' of a long sum was flattened again and read token by token (a
    sum of 1050 terms ran for minutes), and past Python's stack the flattening recursed into
    libclang's callback, which swallowed the RecursionError and cut the AST short. After:
    each sum is read once, without recursion, in about a second."""
    from conftest import in_thread

    stock = fixture_text(STOCK)
    at = stock.index("static_cast<int64_t>(block_table[block_idx]);") + len(
        "static_cast<int64_t>(block_table[block_idx]);"
    )
    long_sum = "\n    const int64_t zz = physical_block_number" + " + 0" * terms + ";"  # a sum, not the tile's
    text = stock[:at] + long_sum + stock[at:]
    found: list = []
    finished, error = in_thread(lambda: found.append(find_sites(text, header_path)), timeout=60)
    assert finished and error is None, error
    assert names(found[0]) == names(find_sites(stock, header_path))


@pytest.mark.parametrize("call, message", [
    (lambda t, h: find_sites(t[:100] + "\udcff" + t[100:], h), "the header is not UTF-8 text"),
    (lambda t, h: find_sites(None, h), "the header must be text"),
    (lambda t, h: find_sites(t.encode(), h), "the header must be text"),
    (lambda t, h: find_sites(t, None), "the header's path must be text"),
    (lambda t, h: find_sites(t, ""), "names no file"),
    (lambda t, h: find_sites(t, "\0"), "names no file"),
    (lambda t, h: find_sites(t, "/"), "names no file"),  # libclang printed a crash dump for it
    (lambda t, h: patch(t, h, None), "the configuration must be a PatchConfig"),
    (lambda t, h: patch(t, h, "lookahead=2"), "the configuration must be a PatchConfig"),
    (lambda t, h: plan(None, make_config()), "the sites must be a Sites"),
    (lambda t, h: patch_header(None, make_config()), "the header must be a Header"),
    (lambda t, h: injections(None), "the parsed header must be a Parsed"),
])  # fmt: skip
def test_the_pipelines_entry_points_refuse_what_they_cannot_take(call, message: str, header_path: str) -> None:
    """Before: a UnicodeEncodeError, an AttributeError (after a whole parse, for a configuration
    that is none), libclang's TranslationUnitLoadError. After: a UsageError saying what is wrong."""
    from kvpatch.errors import UsageError

    with pytest.raises(UsageError, match=message):
        call(fixture_text(STOCK), header_path)


@pytest.mark.parametrize("change, message", [
    (lambda t: t.replace("static_cast<int64_t>(block_table[block_idx]);",
                         "static_cast<int64_t>(block_table[block_idx]);  // note \\", 1),
     r"line \d+: a '//' comment ending in a backslash continues onto the next line"),
    (lambda t: t.replace("\n", "\r"), "the header's lines end in CR alone"),
])  # fmt: skip
def test_a_header_kvpatch_cannot_insert_into_is_said_as_what_it_is(change, message: str, header_path: str) -> None:
    """Before: a comment ending in a backslash after the block number swallowed kvpatch's first
    line and the check after patching blamed the header's markers ('unmatched kvpatch:end at line
    N ... restore the header', a line the input does not have); a header of CR line endings was
    'the kernel starts on the first line of the file'. After: the cause, in one line."""
    with pytest.raises(PatchError, match=message):
        patch(change(fixture_text(STOCK)), header_path, make_config())
