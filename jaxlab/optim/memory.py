"""Memory accounting for optimizers and training, from shapes alone (`jax.eval_shape`; nothing is allocated).

Used for the memory columns of SCALE (arXiv 2506.16659, which reports params + optimizer state: Adam 3x the
params, SCALE the params plus one LM-head momentum) and of the GaLore/APOLLO/Muon baselines.

Activation estimate for a decoder LM (`jaxlab.models.transformer`), in bytes, for batch B, sequence T, layers L,
width D, mlp F, heads H, kv heads G, head dim K, vocab V; `a` = bytes of the compute dtype:
  per layer (what backward keeps without rematerialization):
    a * B*T * (4D + 2HK + 2GK + 3F)    block input, attn-norm output, q, k, v, attention output, residual after
                                       attention, mlp-norm output, gate and up pre-activations, act(gate)*up
    + 4 * B*H*T*T                      attention probabilities (fp32 softmax)
  outside the layers: a * 2*B*T*D (final norm input/output) + 4 * B*T*V (fp32 logits).
  With cfg.remat only each layer's input is kept, a * L*B*T*D, plus one layer's set during its recomputation.
This counts the tensors a hand-written backward needs; JAX's autodiff without remat keeps more (elementwise
intermediates such as the SiLU sigmoid and norm statistics): about 1.9x this on the tiny config, as reported
by `jax.ad_checkpoint.print_saved_residuals`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from jaxlab.models import transformer as tfm
from jaxlab.optim import registry


def tree_bytes(tree) -> int:
  """Sum of size * itemsize over the leaves (arrays or ShapeDtypeStructs)."""
  return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _optimizer(optimizer, axes) -> optax.GradientTransformation:
  if isinstance(optimizer, str):
    return registry.get(optimizer, 1e-3, axes=axes)
  return optimizer


def state_bytes(optimizer, params_shapes, axes=tfm.AXES) -> int:
  """Bytes of the optimizer state for params of these shapes.

  Args:
    optimizer: an optax GradientTransformation, or a name of `jaxlab.optim.names()` (default hyperparameters).
    params_shapes: a param tree of arrays or jax.ShapeDtypeStructs.
    axes: the params' logical axis rules, for an optimizer given by name (default: the transformer's).
  """
  return tree_bytes(jax.eval_shape(_optimizer(optimizer, axes).init, params_shapes))


def param_shapes(cfg, param_dtype=None):
  """ShapeDtypeStructs of `transformer.init(cfg)` (in `param_dtype` when given)."""
  if param_dtype is not None:
    cfg = cfg.replace(param_dtype=jnp.dtype(param_dtype).name)
  return jax.eval_shape(lambda: tfm.init(cfg, jax.random.key(0)))


def activation_bytes(cfg, batch: int, seq: int, dtype=None) -> int:
  """The activation estimate of the module docstring (compute dtype `dtype`, default cfg.dtype)."""
  a = jnp.dtype(dtype or cfg.dtype).itemsize
  b_t = batch * seq
  d, f, h, g, k = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.kv_heads, cfg.kdim
  layer = a * b_t * (4 * d + 2 * h * k + 2 * g * k + 3 * f) + 4 * batch * h * seq * seq
  kept = a * cfg.n_layers * b_t * d + layer if cfg.remat else cfg.n_layers * layer
  return kept + a * 2 * b_t * d + 4 * b_t * cfg.vocab_size


def training_memory(cfg, optimizer, batch: int, seq: int, *, param_dtype=None, dtype=None) -> dict:
  """Training memory in bytes of a decoder LM with one optimizer.

  Args:
    cfg: a `transformer.Config` (e.g. `transformer.PRESETS["llama-1b"]`).
    optimizer: an optax GradientTransformation or a registry name.
    batch, seq: tokens per step are batch * seq.
    param_dtype: params (and grads, and the optimizer state that follows them); default cfg.param_dtype.
    dtype: compute dtype of the activations; default cfg.dtype.

  Returns:
    dict with params, grads, optimizer_state, activations, model_and_optimizer (params + state, the paper's
    memory column) and total (params + grads + state + activations), all in bytes.
  """
  shapes = param_shapes(cfg, param_dtype)
  params = tree_bytes(shapes)
  state = state_bytes(optimizer, shapes)
  acts = activation_bytes(cfg, batch, seq, dtype)
  return {"params": params, "grads": params, "optimizer_state": state, "activations": acts,
          "model_and_optimizer": params + state, "total": 2 * params + state + acts}
