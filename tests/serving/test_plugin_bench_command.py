"""``kvpatch plugin bench`` as a user types it: every refusal is one line with exit 2, before
any engine, GPU or vLLM import; the model is a shape kvpatch knows or a directory; the report
renders what the run measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli.cli_helpers import assert_one_line_error, run_cli

from kvpatch.commands import serving as S
from kvpatch.decode.models import model_shape
from kvpatch.render import serving_lines


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--dtype", "fp32"], "fp16 or bf16"),
        (["--batch-sizes", "0"], "out of range"),
        (["--batch-sizes", "1,x"], "invalid list"),
        (["--batch-sizes", "+5"], "comma-separated whole numbers"),
        (["--batch-sizes", "1_000"], "comma-separated whole numbers"),
        (["--batch-sizes", "\u0663"], "comma-separated whole numbers"),  # an Arabic-Indic 3, which int() reads
        (["--workload", "4096:256"], "INPUT:OUTPUT:BATCHES"),
        (["--workload", "4096:+-5:8"], "not a whole number"),
        (["--starts", "0"], "--starts"),
        (["--gpu-memory-utilization", "2"], "gpu-memory-utilization"),
        (["--max-model-len", "1000"], "--max-model-len 1000 is shorter than workload 512x512 B1"),
        (["--max-model-len", "x"], "--max-model-len"),
        (["--model", "SMALL", "--max-model-len", "4096"], "--max-model-len 4096: the model has 2048 positions"),
        (["--model", "SMALL", "--workload", "4096:256:8"], "needs 4352 tokens: the model has 2048"),
        (["--budget", "0"], "--budget"),
        (["--json", "/proc/kvpatch-no/x.json"], "--json"),
        (["--raw", "FILE"], "not a directory"),
        (["--model", "llama-9"], "neither a directory nor a model shape"),
        (["--model", "FILE"], "neither a directory"),
        (["--bundle", "grouped"], "NAME=DIR"),
        (["--bundle", "Grouped=FILE"], "lower-case letters"),
        (["--bundle", "vllm-twin=."], "the name 'vllm-twin' is taken"),
        (["--bundle", "g=nowhere"], "--bundle g: no bundle at"),
        (["--bundle", "g=FILE"], "--bundle g: cannot read"),
        (["--bundle", "a=x", "--bundle", "b=x", "--bundle", "c=x", "--bundle", "d=x"], "at most 3"),
        (["--bundle", "g=DEEP"], "--bundle g: damaged manifest"),
        (["--bundle", "g=~no-such-user-kvpatch/b"], "its '~' names no home directory"),
        (["--model", "~no-such-user-kvpatch/m"], "its '~' names no home directory"),
    ],
)
def test_bad_options_are_one_line_before_anything_runs(tmp_path, args, needle):
    (tmp_path / "FILE").write_text("x")
    (tmp_path / "SMALL").mkdir()
    (tmp_path / "SMALL" / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    (tmp_path / "DEEP").mkdir()
    (tmp_path / "DEEP" / "bundle.json").write_text("[" * 5000 + "]" * 5000)  # 10 kB that Python's parser recurses on
    proc = run_cli("plugin", "bench", *args, cwd=tmp_path)
    assert_one_line_error(proc, 2, needle)


def test_a_model_config_nested_too_deeply_is_no_traceback(tmp_path):
    """Its positions cannot be read: the engine is left to say what is wrong (here: no vLLM)."""
    (tmp_path / "DEEP").mkdir()
    (tmp_path / "DEEP" / "config.json").write_text("[" * 5000 + "]" * 5000)
    assert_one_line_error(run_cli("plugin", "bench", "--model", "DEEP", cwd=tmp_path), 2)


def test_a_model_config_larger_than_any_model_s_is_refused_unread(tmp_path, monkeypatch):
    """Before: --model DIR read its config.json whole, whatever its size (3 GB: 17 s and 4 GB of
    memory before the GPU check). After: refused beyond 16 MiB, one line, exit 2."""
    import kvpatch.commands.serving as C

    monkeypatch.setattr(C, "CONFIG_LIMIT", 1024)
    (tmp_path / "BIG").mkdir()
    (tmp_path / "BIG" / "config.json").write_text(json.dumps({"max_position_embeddings": 2048, "pad": "x" * 2048}))
    with pytest.raises(
        S.UsageError, match=r"^--model BIG: its config.json .*BIG/config.json is \d+ bytes, more than the 1024"
    ):
        C.bench(C.ServingBenchOptions(model="BIG", cwd=tmp_path))


def test_the_context_defaults_to_8192_tokens_or_the_models_positions_if_fewer(tmp_path):
    from kvpatch.serving import Workload

    rows = [Workload(512, 512, 1), Workload(512, 512, 64)]
    model = tmp_path / "m"
    model.mkdir()

    def context(positions, given=None):
        (model / "config.json").write_text(
            json.dumps({} if positions is None else {"max_position_embeddings": positions})
        )
        return S._context(S.ServingBenchOptions(max_model_len=given), rows, model, None)

    assert context(131072) is None  # the default: 8192 tokens
    assert context(4096) == 4096 and context(8000) == 8000  # fewer positions than the default
    assert context(None) is None and context(None, 3000) == 3000  # unknown: vLLM reads its config
    assert context(4096, 2048) == 2048
    assert S._context(S.ServingBenchOptions(), rows, None, model_shape("llama-3.1-8b")) is None


def test_without_vllm_it_refuses_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr("kvpatch.commands.plugin.installed_vllm", lambda: None)
    proc = run_cli("plugin", "bench", cwd=tmp_path)
    assert_one_line_error(proc, 2, "vLLM is not installed", "starts vLLM's engine")


def test_a_vllm_without_a_v0_engine_is_refused(monkeypatch):
    monkeypatch.setattr("kvpatch.commands.plugin.installed_vllm", lambda: "0.11.2")
    with pytest.raises(S.UsageError, match="no V0 engine"):
        S.preflight()


def test_a_plugin_that_would_not_run_is_refused_with_its_reason(monkeypatch):
    from kvpatch.vllm_plugin import Decision

    monkeypatch.setattr("kvpatch.commands.plugin.installed_vllm", lambda: "0.10.2")
    monkeypatch.setattr(
        "kvpatch.commands.plugin.status", lambda: Decision("off", "no bundle in /x", "run 'kvpatch plugin enable'")
    )
    with pytest.raises(
        S.UsageError, match=r"would not run kvpatch's kernels here: no bundle in /x; run 'kvpatch plugin enable'"
    ):
        S.preflight()


def test_a_model_is_a_known_shape_written_as_its_config_or_a_directory_with_one(tmp_path):
    o = S.ServingBenchOptions(model="Llama-3.1-8B", cwd=tmp_path)
    where, label, dummy, _ = S._model(o, tmp_path / "raw", "bfloat16")
    config = json.loads((Path(where) / "config.json").read_text())
    assert label == "llama-3.1-8b" and dummy
    # the published config.json's values (meta-llama/Llama-3.1-8B)
    assert {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                   "intermediate_size", "vocab_size", "rope_theta", "tie_word_embeddings")} == {
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "intermediate_size": 14336, "vocab_size": 128256, "rope_theta": 500000.0, "tie_word_embeddings": False}  # fmt: skip
    assert config["rope_scaling"]["rope_type"] == "llama3" and config["architectures"] == ["LlamaForCausalLM"]
    assert model_shape("qwen2.5-7b").hf_config("float16")["architectures"] == ["Qwen2ForCausalLM"]
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(S.UsageError, match="no config.json"):
        S._model(S.ServingBenchOptions(model="mine", cwd=tmp_path), tmp_path / "raw", "bfloat16")
    (mine / "config.json").write_text("{}")
    assert S._model(S.ServingBenchOptions(model="mine", cwd=tmp_path), tmp_path, "bfloat16")[2] is False
    with pytest.raises(S.UsageError, match="neither a directory nor a model shape"):
        S._model(S.ServingBenchOptions(model="llama-9", cwd=tmp_path), tmp_path / "raw", "bfloat16")


def test_the_report_names_what_each_arm_ran_and_the_aa_reading():
    row = {"n": 2, "median": 6.0, "min": 5.9, "max": 6.1}
    ratio = {"n": 2, "median": 1.1, "lo": 1.05, "hi": 1.15, "verdict": "faster"}
    aa = {"n": 2, "median": 1.0, "lo": 0.99, "hi": 1.01, "verdict": "noise"}
    arm = {"kernels": "vllm", "starts": 2, "kernels_logged": ["vllm"], "plugin_lines": [],
           "engine_start_s": {"n": 2, "median": 41.0}}  # fmt: skip
    report = {
        "model": "llama-3.1-8b", "dtype": "bf16", "engine_starts": 5, "planned": 6, "starts_per_arm": 2,
        "complete": False, "environment": {"vllm": "0.10.2", "gpu": "NVIDIA H200", "torch": "2.11.0"},
        "engine": {"dummy_weights": True}, "raw": "/r",
        "arms": {"kvpatch": {**arm, "kernels": "kvpatch", "kernels_logged": ["kvpatch"]}, "vllm": arm, "vllm-twin": arm},
        "workloads": [{"workload": "512x512 B64", "arms": {a: {m: row for m in ("decode_ms", "latency_s", "tokens_per_s")}
                       for a in ("kvpatch", "vllm", "vllm-twin")},
                       "speedup": {"decode_ms": ratio}, "aa": {"decode_ms": aa}}],
    }  # fmt: skip
    text = "\n".join(serving_lines(report))
    assert "V0 engine with the XFORMERS backend" in text and "NVIDIA H200" in text and "dummy weights" in text
    assert "INCOMPLETE" in text and "5 of 6" in text
    assert "kvpatch: 2 starts, kvpatch's kernels needed, the plugin logged kvpatch" in text
    assert "512x512 B64  6.00 (5.90-6.10)" in text and "1.100 (1.050-1.150)  1.000 (0.990-1.010)" in text


def test_an_empty_model_is_refused_not_taken_for_the_current_directory(tmp_path):
    """Before: with a config.json here, --model '' (an unset variable) was this directory."""
    (tmp_path / "config.json").write_text("{}")
    assert_one_line_error(run_cli("plugin", "bench", "--model", "", cwd=tmp_path), 2, "--model is empty")
