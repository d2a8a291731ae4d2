"""The stand-in's EngineArgs: the fields vLLM 0.10.2 has that kvpatch's worker passes,
less ``max_seq_len_to_capture`` (so a test sees an argument a release lacks left out)."""

from dataclasses import dataclass


@dataclass
class EngineArgs:
    model: str = ""
    tokenizer: str = ""
    skip_tokenizer_init: bool = False
    dtype: str = "auto"
    seed: int = 0
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 0
    enable_chunked_prefill: bool = False
    enforce_eager: bool = False
    cuda_graph_sizes: list = None
    hf_overrides: dict = None
    load_format: str = "auto"
    disable_log_stats: bool = False
    enable_prefix_caching: bool = False
