"""Layers as pure functions over param dicts: linear, embedding, norms, rotary embeddings, attention, MLP."""
from jaxlab.nn import attention, axes, rope  # noqa: F401
from jaxlab.nn.attention import attention as mha, causal_mask, init_cache  # noqa: F401
from jaxlab.nn.layers import (ACTIVATIONS, embed, embed_init, layer_norm, linear, linear_init,  # noqa: F401
                              mlp, mlp_init, norm, norm_init, normal, rms_norm, unembed)
