"""Model shapes for the decode benchmark, from the models' own ``config.json`` values.

Only what one decoder layer's kernels need: hidden size, query/KV heads, head size,
MLP intermediate size and the RMSNorm epsilon. RoPE, the embedding and the LM head
are left out of the step (they do not touch the attention or the layer weights the
prefetch is about).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_size: int
    intermediate: int
    rms_eps: float = 1e-5
    source: str = ""
    # The rest of config.json, for starting a real engine on the shape with dummy weights
    # (kvpatch plugin bench): the decode step above uses none of it.
    layers: int = 0
    vocab: int = 0
    tie_embeddings: bool = False
    qkv_bias: bool = False
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, float | str], ...] = ()
    max_position: int = 8192
    architecture: str = "LlamaForCausalLM"

    @property
    def q_size(self) -> int:
        return self.heads * self.head_size

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_size

    @property
    def qkv_out(self) -> int:
        return self.q_size + 2 * self.kv_size

    def layer_weight_elems(self) -> dict[str, int]:
        """Elements of each layer weight: qkv, o_proj, gate_up, down (norms aside)."""
        return {
            "qkv": self.qkv_out * self.hidden,
            "o_proj": self.hidden * self.q_size,
            "gate_up": 2 * self.intermediate * self.hidden,
            "down": self.hidden * self.intermediate,
        }

    def layer_weight_bytes(self, elem_size: int) -> int:
        return elem_size * (sum(self.layer_weight_elems().values()) + 2 * self.hidden)

    def kv_bytes_per_token(self, elem_size: int) -> int:
        """One layer's K + V bytes per token."""
        return 2 * self.kv_size * elem_size

    def to_dict(self) -> dict:
        return asdict(self)

    def hf_config(self, torch_dtype: str) -> dict:
        """The model's ``config.json`` as Hugging Face writes it (what vLLM reads to build the
        model; with dummy weights nothing else of the checkpoint is needed)."""
        qwen = self.architecture.startswith("Qwen2")
        config = {
            "architectures": [self.architecture], "model_type": "qwen2" if qwen else "llama",
            "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_size,
            "num_hidden_layers": self.layers, "vocab_size": self.vocab, "rms_norm_eps": self.rms_eps,
            "max_position_embeddings": self.max_position, "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) or None, "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu", "torch_dtype": torch_dtype, "bos_token_id": 1, "eos_token_id": 2,
        }  # fmt: skip
        if not qwen:
            config.update(attention_bias=self.qkv_bias, mlp_bias=False)
        return config


def _llama3_rope(factor: float) -> tuple[tuple[str, float | str], ...]:
    """Llama 3.1/3.2's ``rope_scaling`` (only the factor differs between them)."""
    return (("factor", factor), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0),
            ("original_max_position_embeddings", 8192), ("rope_type", "llama3"))  # fmt: skip


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        # meta-llama/Llama-3.1-8B config.json: hidden_size 4096, num_attention_heads 32,
        # num_key_value_heads 8, head_dim 128, intermediate_size 14336, rms_norm_eps 1e-5
        # num_hidden_layers 32, vocab_size 128256, rope_theta 500000 with llama3 scaling (factor 8),
        # max_position_embeddings 131072, untied embeddings
        ModelShape(
            "llama-3.1-8b",
            4096,
            32,
            8,
            128,
            14336,
            1e-5,
            "meta-llama/Llama-3.1-8B config.json",
            32,
            128256,
            False,
            False,
            500000.0,
            _llama3_rope(8.0),
            131072,
        ),
        # meta-llama/Llama-3.2-1B config.json: hidden_size 2048, num_attention_heads 32,
        # num_key_value_heads 8, head_dim 64, intermediate_size 8192, rms_norm_eps 1e-5
        # num_hidden_layers 16, llama3 rope scaling factor 32, tied embeddings
        ModelShape(
            "llama-3.2-1b",
            2048,
            32,
            8,
            64,
            8192,
            1e-5,
            "meta-llama/Llama-3.2-1B config.json",
            16,
            128256,
            True,
            False,
            500000.0,
            _llama3_rope(32.0),
            131072,
        ),
        # meta-llama/Llama-3.2-3B config.json: hidden_size 3072, num_attention_heads 24,
        # num_key_value_heads 8, head_dim 128, intermediate_size 8192, rms_norm_eps 1e-5
        # num_hidden_layers 28, llama3 rope scaling factor 32, tied embeddings
        ModelShape(
            "llama-3.2-3b",
            3072,
            24,
            8,
            128,
            8192,
            1e-5,
            "meta-llama/Llama-3.2-3B config.json",
            28,
            128256,
            True,
            False,
            500000.0,
            _llama3_rope(32.0),
            131072,
        ),
        # Qwen/Qwen2.5-7B config.json: hidden_size 3584, num_attention_heads 28,
        # num_key_value_heads 4 (head 3584/28 = 128), intermediate_size 18944, rms_norm_eps 1e-6;
        # its QKV bias (4608 values a layer) is left out of the step
        # num_hidden_layers 28, vocab_size 152064, rope_theta 1e6, max_position_embeddings 131072
        ModelShape(
            "qwen2.5-7b",
            3584,
            28,
            4,
            128,
            18944,
            1e-6,
            "Qwen/Qwen2.5-7B config.json (no QKV bias)",
            28,
            152064,
            False,
            True,
            1000000.0,
            (),
            131072,
            "Qwen2ForCausalLM",
        ),
    )
}


def model_shape(name: str) -> ModelShape:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise UsageError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}") from None
