"""Stand-in for vllm/vllm_flash_attn/layers/rotary.py, which vLLM's CMake build installs and
its sdist lacks (see README.md): imported at start-up, called only by multimodal models."""


def apply_rotary_emb(*args, **kwargs):
    raise NotImplementedError("vllm_flash_attn's rotary is not built here (kvpatch's serving stand-in)")
