"""The model-shaped decode step (kvpatch.decode.step, .models) on the CPU: the new token's K/V land
where vLLM's kernels read them, the whole step equals a plain model with contiguous K/V, the step
launches the attention kernel vLLM's rule picks, the weights' byte count, and with a controller
(a logging fake) where the forks and joins fall among the step's kernels."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from decode_helpers import TINY, ReferenceKernels, logging_controller, one_thread  # noqa: E402

from kvpatch.decode.models import MODELS, model_shape  # noqa: E402
from kvpatch.decode.options import WeightPrefetch  # noqa: E402
from kvpatch.decode.step import DecodeStep, DecodeWeights  # noqa: E402
from kvpatch.decode.windows import plan_forks  # noqa: E402
from kvpatch.errors import UsageError  # noqa: E402
from kvpatch.prefetch.controller import default_grid  # noqa: E402

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture
def tiny_step():
    weights = DecodeWeights(TINY, "bf16", layers=2, device="cpu", seed=3)
    return DecodeStep(weights, batch=3, context=37, seed=5)  # 37 tokens: 3 blocks, the last partly filled


def test_step_writes_the_new_token_where_vllm_reads_it(tiny_step):
    st, s = tiny_step, TINY
    F = torch.nn.functional
    w = st.w.per_layer[0]
    h = F.rms_norm(st.x0, (s.hidden,), w["norm1"], s.rms_eps)
    qkv = F.linear(h, w["qkv"])
    k_new = qkv[:, s.q_size : s.q_size + s.kv_size].reshape(3, s.kv_heads, s.head_size)
    v_new = qkv[:, s.q_size + s.kv_size :].reshape(3, s.kv_heads, s.head_size)
    st.step(ReferenceKernels())
    pos = 36
    for seq in range(3):
        block = int(st.block_tables[0][seq, pos // 16])
        # key_cache[block, kv, d // x, pos % 16, d % x] holds k[kv, d]
        k = st.key_caches[0][block, :, :, pos % 16, :].reshape(s.kv_heads, s.head_size)
        v = st.value_caches[0][block, :, :, pos % 16]
        assert torch.equal(k, k_new[seq]) and torch.equal(v, v_new[seq])


def _contiguous_model(st, lib):
    """The step's layers as a plain model over contiguous K/V (gathered from the paged caches
    before the step, the new token appended); runs ``st.step(lib)`` and returns the model's output."""
    s, F = st.w.shape, torch.nn.functional
    n, B = st.context - 1, st.batch
    kv = []
    for layer in range(st.w.layers):
        per_seq = []
        for seq in range(B):
            blocks = st.block_tables[layer][seq].long()
            k = st.key_caches[layer][blocks].permute(0, 3, 1, 2, 4).reshape(-1, s.kv_heads, s.head_size)[:n].clone()
            v = st.value_caches[layer][blocks].permute(0, 3, 1, 2).reshape(-1, s.kv_heads, s.head_size)[:n].clone()
            per_seq.append((k, v))
        kv.append(per_seq)
    st.step(lib)
    x = st.x0
    group = s.heads // s.kv_heads
    for layer, w in enumerate(st.w.per_layer):
        qkv = F.linear(F.rms_norm(x, (s.hidden,), w["norm1"], s.rms_eps), w["qkv"])
        attn = torch.empty(B, s.heads, s.head_size, dtype=x.dtype)
        for seq in range(B):
            q = qkv[seq, : s.q_size].view(s.heads, s.head_size).float()
            k_new = qkv[seq, s.q_size : s.q_size + s.kv_size].view(s.kv_heads, s.head_size)
            v_new = qkv[seq, s.q_size + s.kv_size :].view(s.kv_heads, s.head_size)
            k = torch.cat([kv[layer][seq][0], k_new[None]]).float()
            v = torch.cat([kv[layer][seq][1], v_new[None]]).float()
            for h in range(s.heads):
                p = torch.softmax((k[:, h // group] @ q[h]) * s.head_size**-0.5, dim=0)
                attn[seq, h] = (p @ v[:, h // group]).to(x.dtype)
        x = x + F.linear(attn.view(B, -1), w["o_proj"])
        gu = F.linear(F.rms_norm(x, (s.hidden,), w["norm2"], s.rms_eps), w["gate_up"])
        x = x + F.linear(F.silu(gu[:, : s.intermediate]) * gu[:, s.intermediate :], w["down"])
    return x


def test_step_matches_a_contiguous_reference_model(tiny_step):
    """The whole step against a plain model, so block tables, slots and layouts must all agree."""
    lib = ReferenceKernels()
    x = _contiguous_model(tiny_step, lib)
    assert lib.calls == ["v1", "v1"]  # 37 tokens: one partition, vLLM's v1
    assert torch.isfinite(tiny_step.out).all()
    assert torch.equal(tiny_step.out, x)


def test_a_long_context_launches_v2_and_still_matches_the_reference():
    """600 tokens at 3 x 4 heads: two partitions and little parallelism, so vLLM takes v2."""
    step = DecodeStep(DecodeWeights(TINY, "bf16", layers=1, device="cpu", seed=1), batch=3, context=600, seed=2)
    assert step.kernel == "v2"
    lib = ReferenceKernels()
    assert torch.equal(_contiguous_model(step, lib), step.out) and lib.calls == ["v2"]


def test_the_models_are_the_published_checkpoints():
    """Layer weights of the real shapes add up to the published parameter counts (Llama's
    embeddings 128256 x hidden, untied in the 8B model, tied in the 1B and 3B; Qwen2.5-7B's
    152064 x hidden, untied, plus the QKV bias the step leaves out), and the step allocates
    exactly the bytes the shape accounts for."""

    def params(m):  # every weight of the checkpoint, from the shape's own fields
        bias = m.qkv_out if m.qkv_bias else 0
        embeddings = (1 if m.tie_embeddings else 2) * m.vocab * m.hidden
        return m.layers * (m.layer_weight_bytes(1) + bias) + embeddings + m.hidden

    m8, m1 = model_shape("llama-3.1-8b"), model_shape("Llama-3.2-1B")
    assert (params(m8), params(m1)) == (
        8_030_261_248,
        1_235_814_400,
    )  # the models' safetensors, parameter for parameter
    m3, qw = model_shape("llama-3.2-3b"), model_shape("qwen2.5-7b")
    assert params(m3) == 3_212_749_824
    assert params(qw) == 7_615_616_512
    assert (m8.vocab, m1.layers, qw.vocab, qw.qkv_bias) == (128256, 16, 152064, True)
    assert m8.kv_bytes_per_token(2) == 2 * 8 * 128 * 2  # one layer's K and V of one token, 8 KV heads of 128
    w = DecodeWeights(TINY, "fp16", layers=2, device="cpu")
    assert w.bytes() == 2 * TINY.layer_weight_bytes(2)
    assert {
        k: v.numel() for k, v in w.per_layer[0].items() if k in TINY.layer_weight_elems()
    } == TINY.layer_weight_elems()
    with pytest.raises(UsageError, match="llama-3.1-8b"):
        model_shape("llama-4")
    assert set(MODELS) == {"llama-3.1-8b", "llama-3.2-1b", "llama-3.2-3b", "qwen2.5-7b"}


def test_the_in_kernel_table_holds_each_layers_o_proj_head_keyed_by_its_key_cache(tiny_step):
    st = tiny_step
    rows = st.tail_rows(4096)
    assert [(k, a) for k, a, _ in rows] == [
        (st.key_caches[i].data_ptr(), st.w.per_layer[i]["o_proj"].data_ptr()) for i in range(2)
    ]
    assert {n for *_, n in rows} == {4096}
    whole = st.w.per_layer[0]["o_proj"].numel() * 2
    assert {n for *_, n in st.tail_rows(1 << 30)} == {whole} and st.tail_rows(0) == []


def _launches_and_ops(step, wpf):
    """Run ``step`` with ``wpf``'s forks on a logging controller; return the launches, attention
    kernels, joins and GEMMs (by weight name) in the order they ran."""
    ctl, api = logging_controller()
    windows = wpf.effective_windows()
    step.add_prefetch(ctl, windows)
    api.log.clear()
    names = {id(t): n for layer in step.w.per_layer for n, t in layer.items()}
    linear = torch.nn.functional.linear

    def spy_linear(x, w, *a):
        api.log.append(("gemm", names.get(id(w))))
        return linear(x, w, *a)

    torch.nn.functional.linear = spy_linear
    try:
        step.step(ReferenceKernels(api.log), ctl, forks=plan_forks(windows, step.w.layers, step.batch), join=wpf.join)
    finally:
        torch.nn.functional.linear = linear
    assert not ctl.pending
    return (
        [e[1] if e[0] == "gemm" else e[0] for e in api.log if e[0] in ("launch", "attention", "wait_stream", "gemm")],
        api,
        ctl,
    )


def test_the_first_form_forks_each_layer_before_attention_and_joins_once(tiny_step):
    wpf = WeightPrefetch(caps={1: 1 << 20, 4: 4096, 8: 0})
    seen, api, ctl = _launches_and_ops(tiny_step, wpf)
    assert [len(t) for t in api.tables] == [3, 1, 3, 1]  # per layer: 1 MiB holds all three weights, 4 KiB o_proj's head
    assert (
        api.tables[0][0][0] == tiny_step.w.per_layer[0]["o_proj"].data_ptr()
    )  # o_proj first: it runs right after attention
    layer = ["qkv", "launch", "attention", "o_proj", "gate_up", "down"]
    assert seen == layer * 2 + ["wait_stream"]
    # batch 3 takes the B<=4 bucket (4 KiB), launched with its own grid; at batch 9 nothing would launch
    assert [e[3] for e in api.log if e[0] == "launch"] == [default_grid(4096)] * 2
    assert ctl.table("attn", 0, 3).bytes == 4096 and ctl.table("attn", 0, 9) is None


def test_fork_and_join_points(tiny_step):
    base = WeightPrefetch(caps=1 << 20)
    assert _launches_and_ops(tiny_step, base)[0] == ["qkv", "launch", "attention", "o_proj", "gate_up", "down"] * 2 + [
        "wait_stream"
    ]
    qkv_first = ["launch", "qkv", "attention", "o_proj", "gate_up", "down"]  # forked before the first RMSNorm
    assert _launches_and_ops(tiny_step, base.with_(fork="qkv"))[0] == qkv_first * 2 + ["wait_stream"]
    per_layer = ["qkv", "launch", "attention", "wait_stream", "o_proj", "gate_up", "down"]
    assert (
        _launches_and_ops(tiny_step, base.with_(join="oproj"))[0] == per_layer * 2
    )  # the final join has nothing pending
    with pytest.raises(UsageError, match="fork"):
        base.with_(fork="mlp")
    with pytest.raises(ValueError, match="join"):
        tiny_step.step(ReferenceKernels(), None, join="never")
