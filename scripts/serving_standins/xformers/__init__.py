"""A stand-in for xformers on the GPU machine (see ../README.md): only the names vLLM's V0
XFORMERS backend uses for *prefill*, written over torch's scaled_dot_product_attention.
Decode does not come here: it runs vLLM's paged-attention ops."""

__version__ = "0.0.0+kvpatch-standin"
