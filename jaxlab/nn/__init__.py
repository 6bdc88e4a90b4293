"""Layers as pure functions over param dicts: linear, embedding, norms, rotary embeddings, attention, MLP."""
from jaxlab.nn import attention, axes, rope
from jaxlab.nn.attention import attention as mha, causal_mask, init_cache
from jaxlab.nn.layers import (ACTIVATIONS, embed, embed_init, layer_norm, linear, linear_init, mlp, mlp_init,
                              norm, norm_init, normal, rms_norm, unembed)
