"""Every option of a GPU command is checked before torch, the GPU or nvcc is touched: a bad one is
one line, exit 2. Here torch cannot be imported at all, so a check that ran only after the GPU
check would end in exit 5 ("needs torch") instead."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli
from conftest import fixture_text, make_tree


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import torch`` fails in this process (as on a machine without it)."""
    monkeypatch.setitem(sys.modules, "torch", None)


# {lib}: a library file that exists; {tree}: a tree to build from
@pytest.mark.parametrize("args, needle", [
    (["bench-decode", "--lib", "stock=/nonexistent.so:p"], "--lib stock '/nonexistent.so': no such file"),
    (["bench-decode", "--lib", "stock={lib}:p", "--prefetch-lib", "/nonexistent"], "--prefetch-lib '/nonexistent'"),
    (["bench-decode", "--lib", "stock={lib}:p", "--prefetch-lib", "/dev/null"], "is a character device"),
    (["bench-decode", "--tree", "{tree}", "--arch", "3.5"], "invalid arch '3.5'"),
    (["bench-decode-sweep", "--lib", "stock={lib}:p", "--out", "/etc/passwd"], "/etc/passwd is not a directory"),
    (["bench-decode-sweep", "--lib", "stock=/nonexistent.so:p"], "--lib stock '/nonexistent.so': no such file"),
    (["bench-decode-sweep", "--lib", "stock={lib}:p", "--prefetch-lib", "/tmp"], "is a directory"),
    (["bench", "--lib", "stock={lib}:p", "--head-sizes", "81"], "invalid --head-sizes value 81"),
    (["bench", "--lib", "stock={lib}:p", "--block-sizes", "7"], "invalid --block-sizes value 7"),
    (["bench", "--tree", "{tree}", "--arch", "3.5"], "invalid arch '3.5'"),
    (["bench", "--lib", "stock={lib}:p", "--device", "gpu"], "invalid --device 'gpu'"),
    (["bench", "--lib", "stock=/dev/zero:p"], "is a character device"),
    (["validate", "--lib", "stock={lib}:p", "--block-sizes", "7"], "invalid --block-sizes value 7"),
    (["validate", "--lib", "stock={lib}:p", "--head-sizes", "81"], "invalid --head-sizes value 81"),
    (["validate", "--tree", "{tree}", "--arch", "6.1"], "invalid arch '6.1'"),
    (["validate", "--lib", "stock={lib}:p", "--device", "cuda:x"], "invalid --device 'cuda:x'"),
    (["validate", "--lib", "stock={lib}:p", "--upstream", "--upstream-dir", "/etc/passwd"], "is not a directory"),
    (["tune", "--tree", "{tree}", "--arch", "5.0"], "invalid arch '5.0'"),
    (["build", "--tree", "{tree}", "--arch", "3.5"], "invalid arch '3.5'"),
    (["plugin", "enable", "--tree", "{tree}", "--arch", "3.5", "--release", "0.10.2"], "invalid arch '3.5'"),
    (["plugin", "enable", "--tree", "{tree}", "--dir", "/etc/passwd", "--build"], "/etc/passwd is not a directory"),
    (["plugin", "status", "--dir", "/etc/passwd"], "--dir /etc/passwd: /etc/passwd is not a directory"),
    (["plugin", "disable", "--dir", "/etc/passwd"], "--dir /etc/passwd: /etc/passwd is not a directory"),
    # a name the build would refuse, refused before: ASCII letters, digits and '_'
    (["bench", "--tree", "{tree}", "--variant", "caf\u00e9={toml}"], "invalid variant name 'caf\u00e9'"),
    (["bench", "--tree", "{tree}", "--variant", "_x={toml}"], "invalid variant name '_x'"),
    (["bench", "--tree", "{tree}", "--variant", "mine={toml}", "--json", "{toml}"], "is --variant mine"),
    (["bench", "--lib", "stock={lib}:p", "--variant", "mine={toml}"], "--variant builds a configuration"),
    # the A/A twin's name, taken by a library: refused where the libraries are parsed, not by the run
    (["bench", "--lib", "stock={lib}:p", "--lib", "stock-aa={lib}:q", "--aa"], "the A/A control's name"),
    (["bench-decode", "--lib", "stock={lib}:p", "--lib", "stock-aa={lib}:q"], "the A/A control's name"),
    (["bench", "--lib", "stock={lib}:p", "--plot", "out.txt"], "--plot 'out.txt': give a file ending in .png"),
    (["bench-decode", "--lib", "stock={lib}:p", "--plot", "noext"], "--plot 'noext': give a file ending in .png"),
    (["bench-decode", "--tree", "{tree}", "--tail", "8"], "--tail needs a weight-tail library named 'tail'"),
    (["validate", "--lib", "stock={lib}:p", "--upstream", "--no-matrix", "--tree", "/nonexistent"], "/nonexistent"),
    (["validate", "--lib", "stock={lib}:p", "--upstream-dir", "up"], "--upstream-dir needs --upstream"),
    (["validate", "--lib", "stock={lib}:p", "--workers", "2"], "--workers needs --upstream"),
    (["validate", "--lib", "stock={lib}:p", "--upstream", "--upstream-dir", "up", "--json", "up"], "--upstream-dir"),
    # a list given empty (an unset shell variable) is not the default
    (["bench", "--lib", "stock={lib}:p", "--kernels", ""], "an empty list ''"),
    (["bench", "--lib", "stock={lib}:p", "--dtypes", " , "], "an empty list ' , '"),
    (["bench", "--lib", "stock={lib}:p", "--heads", ""], "invalid heads ''"),
    (["validate", "--lib", "stock={lib}:p", "--alibi", ""], "an empty on/off list"),
    (["bench-decode", "--lib", "stock={lib}:p", "--models", ""], "an empty list ''"),
    (["build", "--tree", "{tree}", "--head-sizes", ""], "an empty list ''"),
    (["bench", "--lib", "stock={lib}:p", "--quick", "--set", "heldout"], "--quick is a point set of its own"),
    (["bench-decode-sweep", "--lib", "stock={lib}:p", "--budget", "inf"], "--budget must be > 0 seconds"),
    (["bench-decode", "--lib", "stock={lib}:p", "--grid", "2147483648"], "from 1 to 2**31-1"),
    (["bench-decode", "--lib", "stock={lib}:p", "--wpf", "grid=2147483648"], "from 1 to 2**31-1"),
    (["bench-decode-sweep", "--lib", "stock={lib}:p", "--out", ".kvpatch"], "kvpatch's state directory"),
    # sizes beyond what any run holds: a typo, refused before a build (a traceback after it, before)
    (["bench", "--lib", "stock={lib}:p", "--batches", "99999999999"], "--batches must be 1 to 1024 sequences"),
    (["bench", "--lib", "stock={lib}:p", "--set", "heldout", "--batches", "0"], "--batches must be 1 to 1024"),
    (["bench-decode", "--lib", "stock={lib}:p", "--batches", "4096"], "--batches must be 1 to 1024 sequences"),
    (["bench-decode", "--lib", "stock={lib}:p", "--layers", "99999999"], "--layers must be at most 128"),
    # a count is ASCII digits: int() alone would read these as 5, 1000 and 3
    (["bench", "--lib", "stock={lib}:p", "--batches", "+5"], "comma-separated whole numbers"),
    (["bench", "--lib", "stock={lib}:p", "--contexts", "1_000"], "comma-separated whole numbers"),
    (["validate", "--lib", "stock={lib}:p", "--head-sizes", "\u0663\u0662"], "comma-separated whole numbers"),
    (["bench", "--lib", "stock={lib}:p", "--heads", "+32/8"], "invalid heads '+32/8'"),
    # a control character in a path is shown as an escape, never as a line break or a space
    (["apply", "--tree", "zz\nyy\rq"], "--tree zz\\nyy\\rq: no such directory"),
    # a directory that is not a vLLM tree: refused as build refuses it, before the GPU is looked for
    (["validate", "--tree", "{notree}"], "is not a vLLM source tree"),
    (["bench", "--tree", "{notree}"], "is not a vLLM source tree"),
    (["tune", "--tree", "{notree}"], "is not a vLLM source tree"),
    (["bench-decode", "--tree", "{notree}"], "is not a vLLM source tree"),
    (["validate", "--lib", "stock={lib}:p", "--upstream", "--tree", "{notree}"], "is not a vLLM source tree"),
    (["build", "--full", "--tree", "{notree}"], "is not a vLLM source tree"),
    # vLLM's test writes its files into --upstream-dir: never into what kvpatch keeps
    (["validate", "--lib", "stock={lib}:p", "--upstream", "--tree", "{tree}", "--upstream-dir", ".kvpatch"],
     "--upstream-dir '.kvpatch' is inside kvpatch's state directory"),
    (["validate", "--lib", "stock={lib}:p", "--upstream", "--tree", "{tree}", "--upstream-dir", "{tree}/csrc/x"],
     "is inside the tree's sources (csrc/)"),
    # the --tree given, not only the last apply's, is what an output may not touch
    (["bench", "--tree", "{tree}", "--json", "{tree}/csrc/attention/attention_kernels.cuh"], "the tree's header"),
    (["tune", "--tree", "{tree}", "-o", "{tree}/csrc/x.toml"], "the tree's sources (csrc/)"),
    (["bench-decode", "--tree", "{tree}", "--json", "{tree}/.git/x"], "the tree's git directory"),
    # with --lib nothing is built: a build's options beside it would be ignored
    (["validate", "--lib", "stock={lib}:p", "--arch", "9.0a"], "--arch builds for an arch; with --lib nothing"),
    (["bench", "--lib", "stock={lib}:p", "--arch", "garbage"], "--arch builds for an arch; with --lib nothing"),
    (["bench-decode", "--lib", "stock={lib}:p", "--arch", "9.0a"], "--arch builds for an arch"),
    (["bench", "--lib", "stock={lib}:p", "--tree", "{tree}"], "--tree builds from a tree; with --lib nothing"),
    (["bench-decode", "--lib", "stock={lib}:p", "--tree", "{tree}"], "--tree builds from a tree"),
    (["validate", "--lib", "stock={lib}:p", "--tree", "{tree}"], "--tree builds from a tree"),
    (["tune", "--lib", "stock={lib}:p", "--tree", "{tree}"], "--tree builds from a tree"),
    (["validate", "--variant-info", "{toml}"], "give it with --lib"),
    (["validate", "--lib", "stock={lib}:p", "--paper"], "--paper builds the paper preset from the tree"),
    (["bench", "--lib", "stock={lib}:p", "--paper"], "--paper and --control build variants from the tree"),
    (["bench", "--lib", "stock={lib}:p", "--control"], "--paper and --control build variants from the tree"),
    (["bench", "--set", ""], "invalid --set ''"),
    (["bench-decode", "--lib", "stock={lib}:p", "--wpf", ""], "--wpf is empty"),
    # a library named in a --libs-file is an input like one given with --lib
    (["bench-decode", "--libs-file", "{libsfile}", "--json", "{lib}"], "is --lib stock"),
    (["bench-decode", "--libs-file", "{libsfile}", "--text", "{lib}"], "is --lib stock"),
    (["bench-decode", "--libs-file", "{comments}"], "names no library"),
    # a relative path in a libs file is read from the file's folder (as gpu_prepare.py writes them)
    (["bench-decode", "--libs-file", "{rellibs}", "--json", "{lib}"], "is --lib stock"),
    # the weight prefetch's numbers: a cap that overflowed (a traceback), counts in other digits, '_'
    # or '+' (read as numbers), a key or batch given twice (the last one silently kept), a cap under
    # 16 bytes (silently none), an empty --wpf, --tail or --lib (an unset shell variable)
    (["bench-decode", "--lib", "stock={lib}:p", "--wpf", "cap=1e303"], "invalid cap '1e303'"),
    (["bench-decode", "--lib", "stock={lib}:p", "--cap", "1:1e303"], "invalid cap '1e303'"),
    (["bench-decode", "--lib", "stock={lib}:p", "--tail", "1e303"], "invalid --tail '1e303'"),
    (["bench-decode", "--lib", "stock={lib}:p", "--cap", "2000000"], "at most 1048576 MiB"),
    (["bench-decode", "--lib", "stock={lib}:p", "--grid", "\u0661\u0666"], "invalid grid"),
    (["bench-decode", "--lib", "stock={lib}:p", "--wpf", "threads=+1_28"], "invalid threads '+1_28'"),
    (["bench-decode", "--lib", "stock={lib}:p", "--cap", "\u0661\u0662"], "invalid cap"),
    (["bench-decode", "--lib", "stock={lib}:p", "--wpf", "grid=4;grid=8"], "'grid' given twice"),
    (["bench-decode", "--lib", "stock={lib}:p", "--cap", "1:12,1:8"], "batch 1 given twice"),
    (["bench-decode", "--lib", "stock={lib}:p", "--wpf", "cap=0.000000001"], "under 16 bytes"),
    (["bench-decode", "--lib", "stock={lib}:p", "--wpf", ";"], "--wpf is empty"),
    (["bench-decode", "--lib", "stock={lib}:p", "--tail", ""], "--tail is empty"),
    (["bench-decode", "--lib", ""], "--lib is empty"),
    (["bench", "--lib", "stock={lib}:p", "--lib", ""], "--lib is empty"),
    # every integer option is a count as written: ASCII digits ('+5', '1_0' and '٣' int() reads)
    (["bench-decode", "--lib", "stock={lib}:p", "--layers", "4_0"], "'4_0' is not a whole number"),
    (["bench", "--lib", "stock={lib}:p", "--rounds", "+3"], "'+3' is not a whole number"),
    (["build", "--tree", "{tree}", "--jobs", "\u0662"], "is not a whole number"),
    (["apply", "--tree", "{tree}", "--lookahead", "1_0"], "'1_0' is not a whole number"),
    (["plugin", "check", "--reps", "0"], "0 is below 1"),
    # and every seconds or fraction option a number as written ('1_0', '١٠', '1e3' float() reads)
    (["validate", "--upstream", "--upstream-timeout", "1_0"], "'1_0' is not a number in ASCII digits"),
    (["plugin", "bench", "--budget", "\u0661\u0660"], "is not a number in ASCII digits"),
    (["plugin", "bench", "--engine-timeout", "1e3"], "'1e3' is not a number in ASCII digits"),
    (["plugin", "bench", "--engine-timeout", "inf"], "--engine-timeout must be > 0 seconds, not inf"),
    # a library's prefix names its C symbols
    (["bench", "--lib", "stock={lib}:fa ke"], "its prefix 'fa ke' is no C name"),
    (["validate", "--lib", "stock={lib}:1p"], "its prefix '1p' is no C name"),
    (["plugin", "bench", "--gpu-memory-utilization", "0.5.0"], "'0.5.0' is not a number in ASCII digits"),
    (["bench-decode-sweep", "--lib", "stock={lib}:p", "--budget", "4_20"], "'4_20' is not a number in ASCII digits"),
    (["bench-decode-sweep", "--lib", "stock={lib}:p", "--budget", "nan"], "--budget must be > 0 seconds, not nan"),
    # plugin bench's engine runs go nowhere kvpatch keeps
    (["plugin", "bench", "--raw", ".kvpatch/runs"], "--raw '"),
    # a libs file saved with a byte-order mark (Windows editors write one) reads as without it
    (["bench-decode", "--libs-file", "{bomlibs}", "--json", "{lib}"], "is --lib stock"),
])  # fmt: skip
def test_every_option_is_checked_before_torch_the_gpu_or_nvcc(args: list[str], needle: str, tmp_path: Path,
                                                              no_torch: None) -> None:  # fmt: skip
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"\x7fELF not really")
    tree = make_tree(tmp_path / "vllm", fixture_text(), commit=False)
    toml = tmp_path / "mine.toml"
    toml.write_text("lookahead = 2\n")
    notree = tmp_path / "notree"
    notree.mkdir()
    (notree / "setup.py").write_text("raise SystemExit('ran')\n")
    libsfile = tmp_path / "libs.txt"
    libsfile.write_text(f"# one library\nstock={lib}:p\n")
    comments = tmp_path / "comments.txt"
    comments.write_text("# nothing here\n\n")
    rellibs = tmp_path / "rel-libs.txt"
    rellibs.write_text(f"stock={lib.name}:p\n")
    bomlibs = tmp_path / "bom-libs.txt"
    bomlibs.write_text(f"\ufeffstock={lib.name}:p\n", encoding="utf-8")
    argv = [a.format(lib=lib, tree=tree, toml=toml, notree=notree, libsfile=libsfile, comments=comments, rellibs=rellibs,
                     bomlibs=bomlibs) for a in args]  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    assert_one_line_error(run_cli(*argv, cwd=work, env={"PATH": "/nonexistent"}), 2, needle)
    assert "torch" not in sys.modules or sys.modules["torch"] is None
