"""kvpatch.gpu.upstream on the CPU: finding vLLM's kernel test, the run directory, JUnit and
record parsing, shards, and whole runs against Python stand-in "libraries" on a small fake
tree (the test runs unchanged through the shim, once per library)."""

from __future__ import annotations

import ast
import json
import os
import signal
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from kvpatch.errors import UsageError
from kvpatch.gpu import upstream as U
from kvpatch.gpu.launch import LibSpec
from kvpatch.render import print_upstream

FAKE_UTILS = """
import psutil  # vLLM's utils import much more than the helpers need: never executed by the shim
import torch

STR_DTYPE_TO_TORCH_DTYPE = {"half": torch.half, "bfloat16": torch.bfloat16, "float": torch.float, "fp8": torch.uint8}


def _generate_random_fp8(tensor, low, high):
    from vllm import _custom_ops as ops
    tmp = torch.empty_like(tensor, dtype=torch.float16)
    tmp.uniform_(low, high)
    ops.convert_fp8(tensor, tmp)


def get_kv_cache_torch_dtype(cache_dtype, model_dtype=None):
    if cache_dtype == "auto":
        return model_dtype
    return STR_DTYPE_TO_TORCH_DTYPE[cache_dtype]


def create_kv_caches_with_random(num_blocks, block_size, num_layers, num_heads, head_size, cache_dtype,
                                 model_dtype=None, seed=None, device="cuda"):
    from vllm.platforms import current_platform
    current_platform.seed_everything(seed)
    torch_dtype = get_kv_cache_torch_dtype(cache_dtype, model_dtype)
    x = 16 // torch.tensor([], dtype=torch_dtype).element_size()
    k = torch.empty((num_blocks, num_heads, head_size // x, block_size, x), dtype=torch_dtype, device=device)
    v = torch.empty((num_blocks, num_heads, head_size, block_size), dtype=torch_dtype, device=device)
    for t in (k, v):
        if cache_dtype == "fp8":
            _generate_random_fp8(t, -0.5, 0.5)
        else:
            t.uniform_(-0.5, 0.5)
    return [k], [v]


def unrelated():
    return psutil.cpu_count()
"""

FAKE_TEST = """
import random

import pytest
import torch

from tests.kernels.allclose_default import get_default_atol
from tests.kernels.utils import opcheck
from vllm import _custom_ops as ops
from vllm.attention.layer import Attention
from vllm.platforms import current_platform
from vllm.utils import get_max_shared_memory_bytes

if not current_platform.is_rocm():
    from xformers import ops as xops
    from xformers.ops.fmha.attn_bias import BlockDiagonalCausalMask

NUM_BLOCKS = 40


def ref(query, kc, vc, tables, lens, scale, slopes):
    out = torch.empty_like(query, dtype=torch.float64)
    bs, x = kc.shape[3], kc.shape[4]
    for i, L in enumerate(lens.tolist()):
        blocks = tables[i, : -(-L // bs)].long()
        k = kc[blocks].permute(0, 3, 1, 2, 4).reshape(-1, kc.shape[1], query.shape[2])[:L].double()
        v = vc[blocks].permute(0, 3, 1, 2).reshape(-1, kc.shape[1], query.shape[2])[:L].double()
        logits = torch.einsum("hd,thd->ht", query[i].double(), k) * scale
        if slopes is not None:
            logits = logits + slopes.double()[:, None] * (torch.arange(L) - L + 1)
        out[i] = torch.einsum("ht,thd->hd", torch.softmax(logits, -1), v)
    return out


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("use_alibi", [False, True])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_paged_attention(kv_cache_factory, version, use_alibi, kv_cache_dtype):
    assert get_max_shared_memory_bytes() == 1024
    current_platform.seed_everything(0)
    heads, head_size, block_size = 2, 16, 8
    query = torch.empty(3, heads, head_size, dtype=torch.float32).uniform_(-1, 1)
    slopes = torch.randn(heads) if use_alibi else None
    lens = torch.tensor([random.randint(1, 40) for _ in range(3)], dtype=torch.int)
    tables = torch.tensor([[random.randint(0, NUM_BLOCKS - 1) for _ in range(5)] for _ in range(3)], dtype=torch.int)
    (kc,), (vc,) = kv_cache_factory(NUM_BLOCKS, block_size, 1, heads, head_size, kv_cache_dtype, torch.float32, 0,
                                    "cpu")
    out = torch.empty_like(query)
    args = (query, kc, vc, heads, head_size ** -0.5, tables, lens, block_size, int(lens.max()), slopes,
            kv_cache_dtype, torch.tensor(1.0), torch.tensor(1.0))
    if version == "v1":
        ops.paged_attention_v1(out, *args)
        opcheck(torch.ops._C.paged_attention_v1, (out, *args, 0, 0, 0, 64, 0))
    else:
        ops.paged_attention_v2(out, None, None, None, *args)
        opcheck(torch.ops._C.paged_attention_v2, (out, *args, 0, 0, 0, 64, 0))
    if kv_cache_dtype == "fp8":
        k32, v32 = torch.empty(kc.shape), torch.empty(vc.shape)
        ops.convert_fp8(k32, kc)
        ops.convert_fp8(v32, vc)
        kc, vc = k32, v32
    torch.testing.assert_close(out.double(), ref(query, kc, vc, tables, lens, head_size ** -0.5, slopes),
                               atol=get_default_atol(out), rtol=1e-5)


def test_not_selected():
    Attention()  # a placeholder: raises if used
"""

BACKEND = '''
import torch


class Good:
    """Computes attention in float64 (the test's own reference), rounds to the output dtype."""

    configs = None

    def v1(self, out, query, kc, vc, num_kv_heads, scale, tables, lens, block_size, max_len, slopes, kv, ks, vs):
        import test_attention as T  # the test module's reference: fine for a stand-in
        if kv == "fp8":
            k32, v32 = torch.empty(kc.shape), torch.empty(vc.shape)
            k32.copy_(kc.view(torch.float8_e4m3fn).float())
            v32.copy_(vc.view(torch.float8_e4m3fn).float())
            kc, vc = k32, v32
        out.copy_(T.ref(query, kc, vc, tables, lens, scale, slopes).to(out.dtype))

    def v2(self, out, exp_sums, max_logits, tmp_out, *args):
        self.v1(out, *args)


class OomOnce(Good):
    """Good, but with ALiBi the first attempt of each test runs out of GPU memory (as vLLM's test
    can beside other workers); a marker file per test in $KVPATCH_TEST_OOM_DIR remembers it."""

    def v1(self, out, *args):
        import hashlib, os
        if args[9] is not None:
            mark = os.path.join(os.environ["KVPATCH_TEST_OOM_DIR"],
                                hashlib.sha1(os.environ["PYTEST_CURRENT_TEST"].encode()).hexdigest())
            if not os.path.exists(mark) or os.environ.get("KVPATCH_TEST_OOM_ALWAYS"):
                open(mark, "w").close()
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 5.28 GiB.")
        super().v1(out, *args)


CALLS = [0]


class Slow(Good):
    """Good for the first call, then each call takes ten minutes: a run the time limit stops
    after its first test, however long pytest takes to start."""

    def v1(self, out, *args):
        import time
        CALLS[0] += 1
        if CALLS[0] > 1:
            time.sleep(600.0)
        super().v1(out, *args)


class Flip(Good):
    """Good, but one bit off whenever ALiBi is on (the kind of difference vLLM's tolerance lets pass)."""

    def v1(self, out, *args):
        super().v1(out, *args)
        if args[9] is not None:
            out.view(torch.int32).view(-1)[0] ^= 1
'''


def make_fake_tree(root: Path, layout: str = "new") -> Path:
    rel = "tests/kernels/attention" if layout == "new" else "tests/kernels"
    files = {
        "tests/__init__.py": "",
        "tests/kernels/__init__.py": "",
        "tests/kernels/allclose_default.py": "import torch\n\ndef get_default_atol(output):\n    return 1e-5\n",
        f"{rel}/conftest.py": "import pytest\n\nfrom vllm.utils import create_kv_caches_with_random\n\n\n"
        "@pytest.fixture()\ndef kv_cache_factory():\n    return create_kv_caches_with_random\n",
        f"{rel}/test_attention.py": FAKE_TEST,
        "vllm/utils.py" if layout == "new" else "vllm/utils/__init__.py": FAKE_UTILS,
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_find_test_both_layouts(tmp_path):
    new = make_fake_tree(tmp_path / "new")
    assert U.find_test(new).path == "tests/kernels/attention/test_attention.py"
    assert U.find_test(new).node_id == "tests/kernels/attention/test_attention.py::test_paged_attention"
    old = make_fake_tree(tmp_path / "old", "old")
    assert U.find_test(old).path == "tests/kernels/test_attention.py"
    with pytest.raises(U.UpstreamError, match="no test_paged_attention"):
        U.find_test(tmp_path / "none")


def test_helper_source_is_the_trees_own_code(tmp_path):
    tree = make_fake_tree(tmp_path, "old")  # helpers in vllm/utils/__init__.py
    src = U.helper_source(tree)
    compile(src, "_vllm_helpers.py", "exec")
    for name in ("create_kv_caches_with_random", "_generate_random_fp8", "get_kv_cache_torch_dtype"):
        node = next(n for n in ast.parse(FAKE_UTILS).body if getattr(n, "name", None) == name)
        assert ast.get_source_segment(FAKE_UTILS, node) in src  # unchanged
    assert "STR_DTYPE_TO_TORCH_DTYPE = {" in src and "psutil" not in src and "def unrelated" not in src
    (tree / "vllm/utils/__init__.py").write_text("def other():\n    pass\n")
    with pytest.raises(U.UpstreamError, match="create_kv_caches_with_random"):
        U.helper_source(tree)


def test_write_run_dir_copies_the_test_unchanged(tmp_path):
    tree = make_fake_tree(tmp_path / "tree")
    test = U.find_test(tree)
    path = U.write_run_dir(test, tmp_path / "run")
    assert path.read_bytes() == (tree / test.path).read_bytes()
    run = tmp_path / "run"
    for rel in (
        "tests/__init__.py",
        "tests/kernels/__init__.py",
        "tests/kernels/allclose_default.py",
        "tests/kernels/attention/conftest.py",
    ):
        assert (run / rel).read_bytes() == (tree / rel).read_bytes()
    assert not (run / "tests/kernels/utils.py").exists()  # served by the shim
    assert "install" in (run / "conftest.py").read_text()
    assert (run / f"{U.SHIM_MODULE}.py").read_text() == Path(U.__file__).with_name("upstream_shim.py").read_text()
    assert "def create_kv_caches_with_random" in (run / f"{U.HELPERS_MODULE}.py").read_text()


def test_junit_cases_and_their_counts(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        textwrap.dedent("""\
        <testsuites><testsuite>
          <testcase classname="t" name="a[1]"/>
          <testcase classname="t" name="a[2]"><failure message="x"/></testcase>
          <testcase classname="t" name="a[3]"><skipped/></testcase>
          <testcase classname="t" name="a[4]"><error message="y"/></testcase>
          <testcase classname="t" name="a[5]"><system-out>ok</system-out></testcase>
          <testcase classname="t" name="a[6]"><failure message="torch.OutOfMemoryError: CUDA out of memory."/></testcase>
          <testcase time="0.000" />
        </testsuite></testsuites>""")
    )  # the last: a test an interrupt stopped, as pytest writes it
    c = U.count_cases(U.junit_cases(xml))
    assert (c["passed"], c["failed"], c["skipped"], c["errors"]) == (2, 2, 1, 1)
    assert c["failures"] == ["t::a[2]", "t::a[4]", "t::a[6]"]
    assert c["oom"] == ["a[6]"]  # only the out-of-memory failure is run again


def test_compare_records(tmp_path):
    def rec(test, out, inputs="i"):
        return {"test": test, "call": 1, "out": out, "inputs": inputs, "caches": "c"}

    base = {"a#1": rec("a", "x"), "b#1": rec("b", "y"), "c#1": rec("c", "z"), "d#1": rec("d", "w")}
    other = {"a#1": rec("a", "x"), "b#1": rec("b", "DIFF"), "c#1": rec("c", "z", inputs="other")}
    counts, differing, notes = U.compare_records(base, other)
    assert counts == {"compared": 2, "identical": 1} and differing == ["b#1"]
    assert any("c#1: inputs differ" in n for n in notes) and any("only one of the runs" in n for n in notes)
    (tmp_path / "record-gw0.jsonl").write_text(json.dumps(rec("a", "x")) + "\n")
    (tmp_path / "record-gw1.jsonl").write_text(json.dumps(rec("b", "y")) + "\n\n")
    assert set(U.read_records(tmp_path)) == {"a#1", "b#1"}


@pytest.mark.slow  # pytest runs the fake test once per stand-in
def test_run_upstream_against_python_stand_ins(tmp_path, monkeypatch):
    """The whole runner on a fake tree: the test runs unchanged through the shim once per
    'library'; a stand-in one bit off with ALiBi still passes vLLM-style tolerances, and
    the record comparison finds exactly those outputs."""
    tree = _stand_in_tree(tmp_path, monkeypatch)
    shim_src = Path(U.__file__).with_name("upstream_shim.py")
    libs = [LibSpec("stock", "python:fakeback.Good", "x"), LibSpec("flip", "python:fakeback.Flip", "x")]
    rep = U.run_upstream(tree, libs, tmp_path / "out", release="fake", workers=1, timeout=300)
    runs = {r.name: r for r in rep.runs}
    assert runs["stock"].passed == 8 and runs["stock"].failed == 0, runs["stock"].log_tail
    assert runs["flip"].passed == 8 and runs["flip"].outputs == 8, runs["flip"].log_tail
    assert rep.identical == {"flip": {"compared": 8, "identical": 4}}
    assert len(rep.differing["flip"]) == 4 and all("True" in k for k in rep.differing["flip"])
    assert not rep.ok
    d = rep.to_dict()
    assert d["kind"] == "kvpatch-upstream" and d["runs"][0]["name"] == "stock"
    assert shim_src.is_file()


@pytest.mark.slow  # pytest runs the fake test once per stand-in
@pytest.mark.parametrize("always", [False, True])
def test_run_upstream_runs_out_of_memory_tests_again_alone(tmp_path, monkeypatch, always):
    """Tests that fail for want of GPU memory in the parallel pass are run again, alone, and
    their second outcome counts; one that runs out of memory again stays failed."""
    tree = _stand_in_tree(tmp_path, monkeypatch)
    (tmp_path / "oom").mkdir()
    monkeypatch.setenv("KVPATCH_TEST_OOM_DIR", str(tmp_path / "oom"))
    if always:
        monkeypatch.setenv("KVPATCH_TEST_OOM_ALWAYS", "1")
    libs = [LibSpec("stock", "python:fakeback.Good", "x"), LibSpec("oom", "python:fakeback.OomOnce", "x")]
    rep = U.run_upstream(tree, libs, tmp_path / "out", release="fake", workers=1, timeout=300)
    runs = {r.name: r for r in rep.runs}
    assert runs["stock"].rerun == [] and runs["stock"].passed == 8
    oom = runs["oom"]
    assert len(oom.rerun) == 4 and all("True" in n for n in oom.rerun), oom.rerun
    assert any("ran out of GPU memory" in n and "run again" in n for n in rep.notes), rep.notes
    # the selection runs only the tests named
    again = U.run_upstream(tree, libs, tmp_path / "out2", release="fake", workers=1, timeout=300, tests=oom.rerun[:1])
    assert [(r.passed + r.failed, r.outputs > 0) for r in again.runs] == [(1, True), (1, always is False)]
    if always:
        assert (oom.passed, oom.failed) == (4, 4) and not rep.ok
    else:
        assert (oom.passed, oom.failed) == (8, 0), oom.log_tail
        assert oom.outputs == 8 and rep.identical == {"oom": {"compared": 8, "identical": 8}}
        assert rep.ok


@pytest.mark.slow
def test_a_run_the_time_limit_stops_reports_what_finished_and_is_not_ok(tmp_path, monkeypatch):
    """At the limit pytest is interrupted, not killed: its JUnit report of the tests that
    finished is read, the run is marked cut, and the report is not ok (however well those went)."""
    tree = _stand_in_tree(tmp_path, monkeypatch)
    libs = [LibSpec("stock", "python:fakeback.Good", "x"), LibSpec("slow", "python:fakeback.Slow", "x")]
    # as when kvpatch runs as a shell's background job (gpu_run.sh): SIGINT ignored, which children
    # inherit; the interrupt must still reach pytest
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rep = U.run_upstream(tree, libs, tmp_path / "out", release="fake", workers=1, timeout=30)
    finally:
        signal.signal(signal.SIGINT, ignored)
    runs = {r.name: r for r in rep.runs}
    assert not runs["stock"].cut and runs["stock"].passed == 8, runs["stock"].log_tail
    slow = runs["slow"]
    assert slow.cut and slow.passed == 1 and slow.failed == 0, (slow, slow.log_tail)
    assert (tmp_path / "out" / "junit-slow.xml").is_file()  # written by the interrupted pytest
    assert rep.identical["slow"] == {"compared": slow.outputs, "identical": slow.outputs} and slow.outputs >= 1
    assert any("slow: stopped at the time limit" in n for n in rep.notes), rep.notes
    assert not rep.ok and rep.to_dict()["runs"][1]["cut"] is True


def test_shards_are_disjoint_cover_every_case_and_parse_strictly():
    names = [f"test_paged_attention[{i}]" for i in range(11)]
    for n in (1, 2, 3, 11, 12):
        shares = [U.shard_of(names, k, n) for k in range(1, n + 1)]
        assert sorted(x for s in shares for x in s) == sorted(names)  # every case once
        assert max(map(len, shares)) - min(map(len, shares)) <= 1  # balanced
    assert U.shard_of(names, 2, 3) == names[1::3]
    assert U.parse_shard(" 2/3 ") == (2, 3) and U.parse_shard("1/1") == (1, 1)
    for bad in ("0/2", "3/2", "2", "a/b", "1/0", "-1/2", ""):
        with pytest.raises(UsageError, match="invalid shard"):
            U.parse_shard(bad)


def test_collected_names_keep_pytest_order_and_only_the_test():
    test = U.UpstreamTest(Path("."), "tests/kernels/test_attention.py")
    out = ("tests/kernels/test_attention.py::test_paged_attention[v1-a]\n"
           "tests/kernels/test_attention.py::test_paged_attention_other[x]\n"
           "  tests/kernels/test_attention.py::test_paged_attention[v2-b]  \n"
           "\n3 tests collected in 0.5s\n")  # fmt: skip
    assert U.collected_names(test, out) == ["test_paged_attention[v1-a]", "test_paged_attention[v2-b]"]


@pytest.mark.slow  # pytest runs the fake test once per stand-in
def test_run_upstream_in_shards_covers_the_whole_test_once(tmp_path, monkeypatch):
    """Two shards of the fake test: each runs half the cases against both stand-ins, pytest
    collecting them on the machine; together they run and compare every case once."""
    tree = _stand_in_tree(tmp_path, monkeypatch)
    libs = [LibSpec("stock", "python:fakeback.Good", "x"), LibSpec("flip", "python:fakeback.Flip", "x")]
    reps = [U.run_upstream(tree, libs, tmp_path / f"out{k}", release="fake", workers=1, timeout=300, shard=(k, 2))
            for k in (1, 2)]  # fmt: skip
    ran = []
    for k, rep in enumerate(reps, 1):
        assert (rep.shard, rep.selected, rep.collected) == (f"{k}/2", 4, 8)
        assert [r.passed for r in rep.runs] == [4, 4], [r.log_tail for r in rep.runs]
        ran.append({key.split("#")[0] for key in U.read_records(tmp_path / f"out{k}" / "record-stock")})
    assert not ran[0] & ran[1] and len(ran[0] | ran[1]) == 8
    assert sum(r.identical["flip"]["compared"] for r in reps) == 8
    assert sum(r.identical["flip"]["identical"] for r in reps) == 4  # as the whole run finds
    assert reps[0].to_dict()["shard"] == "1/2"


def _stand_in_tree(tmp_path: Path, monkeypatch) -> Path:
    """A fake release tree whose test runs through the shim against the stand-in "libraries" of
    BACKEND (``python:fakeback.NAME``); skips without torch."""
    pytest.importorskip("torch")
    tree = make_fake_tree(tmp_path / "tree")
    back = tmp_path / "backend"
    back.mkdir()
    (back / "fakeback.py").write_text(BACKEND)
    # the test module is imported as 'test_attention' (rootdir-relative, no __init__ in its folder)
    monkeypatch.setenv("PYTHONPATH", f"{back}{os.pathsep}{tree / 'tests/kernels/attention'}")
    # the fake test asserts 1024 bytes of shared memory: the shim would ask CUDA, so answer for it
    monkeypatch.setattr(U, "write_run_dir", _with_fake_shared_memory(U.write_run_dir))
    return tree


def _with_fake_shared_memory(write_run_dir):
    def wrapped(test, dest):
        out = write_run_dir(test, dest)
        conftest = Path(dest) / "conftest.py"
        conftest.write_text(
            conftest.read_text() + "\nkvpatch_upstream_shim.get_max_shared_memory_bytes = lambda gpu=0: 1024\n"
            "kvpatch_upstream_shim.KNOWN['get_max_shared_memory_bytes'] = lambda gpu=0: 1024\n"
        )
        return out

    return wrapped


def test_the_table_names_the_share_and_a_cut_run():
    runs = [
        U.UpstreamRun("stock", "s", 0, passed=4, outputs=4),
        U.UpstreamRun("patched", "p", 2, passed=2, outputs=2, cut=True),
    ]
    rep = U.UpstreamReport("0.6.4", "t::test_paged_attention", "stock", runs, identical={"patched": {"compared": 2, "identical": 2}},
                           notes=["patched: stopped at the time limit (12 s) after 2 test(s)"], shard="1/2", selected=4, collected=8)  # fmt: skip
    console = Console(record=True, width=200)
    print_upstream(rep, console)
    text = console.export_text()
    assert "shard 1/2: 4 of its 8 cases" in text and "patched (cut at the time limit)" in text
    assert "stock (cut" not in text and "2/2" in text and "note: patched: stopped at the time limit" in text
