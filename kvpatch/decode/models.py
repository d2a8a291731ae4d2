"""Model shapes for the decode benchmark, from the models' own ``config.json`` values.

Only what one decoder layer's kernels need: hidden size, query/KV heads, head size,
MLP intermediate size and the RMSNorm epsilon. RoPE, the embedding and the LM head
are left out of the step (they do not touch the attention or the layer weights the
prefetch is about).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


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


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        # meta-llama/Llama-3.1-8B config.json: hidden_size 4096, num_attention_heads 32,
        # num_key_value_heads 8, head_dim 128, intermediate_size 14336, rms_norm_eps 1e-5
        ModelShape("llama-3.1-8b", 4096, 32, 8, 128, 14336, 1e-5, "meta-llama/Llama-3.1-8B config.json"),
        # meta-llama/Llama-3.2-1B config.json: hidden_size 2048, num_attention_heads 32,
        # num_key_value_heads 8, head_dim 64, intermediate_size 8192, rms_norm_eps 1e-5
        ModelShape("llama-3.2-1b", 2048, 32, 8, 64, 8192, 1e-5, "meta-llama/Llama-3.2-1B config.json"),
        # meta-llama/Llama-3.2-3B config.json: hidden_size 3072, num_attention_heads 24,
        # num_key_value_heads 8, head_dim 128, intermediate_size 8192, rms_norm_eps 1e-5
        ModelShape("llama-3.2-3b", 3072, 24, 8, 128, 8192, 1e-5, "meta-llama/Llama-3.2-3B config.json"),
        # Qwen/Qwen2.5-7B config.json: hidden_size 3584, num_attention_heads 28,
        # num_key_value_heads 4 (head 3584/28 = 128), intermediate_size 18944, rms_norm_eps 1e-6;
        # its QKV bias (4608 values a layer) is left out of the step
        ModelShape("qwen2.5-7b", 3584, 28, 4, 128, 18944, 1e-6, "Qwen/Qwen2.5-7B config.json (no QKV bias)"),
    )
}


def model_shape(name: str) -> ModelShape:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}") from None
