from . import attn_bias  # noqa: F401
