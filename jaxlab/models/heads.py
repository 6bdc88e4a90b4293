"""Reward-model heads over a decoder LM's final hidden states, and process-reward (PRM) aggregation.

Two layouts, as the public PRM checkpoints have them:
- "value" (Skywork-PRM): `v_head.summary`, a linear map D -> 1; a reward is the sigmoid of the value at a
  position (the last token for an outcome reward, each step's separator for step rewards).
- "step" (Qwen2.5-Math-PRM, arXiv 2501.07301): `score`, Linear(D, D) -> ReLU -> Linear(D, 2); the step reward is
  softmax(logits)[1] at each step-separator token.
The head reads `transformer.forward(..., capture=("hidden_states",)).hidden_states[-1]` (after the final norm).
Step rewards of a solution aggregate into one score by "min", "last" or "product" over its steps.

Axes: B batch, T positions, D model width, C classes (1 for the value head, 2 for the step head).
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp

from jaxlab import choices
from jaxlab.models import transformer as tfm
from jaxlab.nn import axes, layers

Kind = Literal["value", "step"]
KINDS = choices.values(Kind)
AGGREGATIONS = ("min", "last", "product")


def _fail(msg):
  raise ValueError(f"heads.Config: {msg}")


@dataclasses.dataclass(frozen=True)
class Config:
  kind: Kind = "value"
  d_model: int = 64
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"

  def __post_init__(self):
    layers.check_dtype_names(self, _fail, ("param_dtype",))
    choices.check(self, _fail, nested=False)

  @property
  def classes(self) -> int:
    return 1 if self.kind == "value" else 2


def init(cfg: Config, key) -> dict:
  """{"v_head": {"summary": D -> 1}} (value) or {"score": {"dense": D -> D, "out": D -> 2}} (step); zero biases."""
  dt = jnp.dtype(cfg.param_dtype)
  lin = lambda k, i, o: layers.linear_init(k, i, o, bias=True, std=cfg.init_std, dtype=dt)
  if cfg.kind == "value":
    return {"v_head": {"summary": lin(key, cfg.d_model, 1)}}
  k1, k2 = jax.random.split(key)
  return {"score": {"dense": lin(k1, cfg.d_model, cfg.d_model), "out": lin(k2, cfg.d_model, 2)}}


# Logical axes of the head's params; a reward model's {"lm": ..., "head": ...} tree takes `tfm.AXES + AXES`.
AXES = axes.rules(
    (r"(v_head/summary|score/out)/kernel", ("embed", "classes"), "embed"),
    (r"(v_head/summary|score/out)/bias", ("classes",), None),
    (r"score/dense/kernel", ("embed", "mlp"), "embed"),
    (r"score/dense/bias", ("mlp",), None),
)


def logits(params, cfg: Config, hidden_BTD):
  """[B, T, C] head logits at every position, in fp32."""
  x = hidden_BTD.astype(jnp.float32)
  if cfg.kind == "value":
    return layers.linear(params["v_head"]["summary"], x, jnp.float32)
  p = params["score"]
  return layers.linear(p["out"], jax.nn.relu(layers.linear(p["dense"], x, jnp.float32)), jnp.float32)


def position_rewards(params, cfg: Config, hidden_BTD):
  """[B, T] reward in (0, 1) at every position: sigmoid(value) or softmax(logits)[1]."""
  z = logits(params, cfg, hidden_BTD)
  return jax.nn.sigmoid(z[..., 0]) if cfg.kind == "value" else jax.nn.softmax(z, axis=-1)[..., 1]


def last_token_reward(params, cfg: Config, hidden_BTD, mask_BT):
  """[B] reward at the last position where `mask_BT` is 1 (right-padded or left-padded rows alike)."""
  t = hidden_BTD.shape[1]
  last = (t - 1) - jnp.argmax(jnp.flip(mask_BT.astype(jnp.int32), axis=1), axis=1)
  return jnp.take_along_axis(position_rewards(params, cfg, hidden_BTD), last[:, None], axis=1)[:, 0]


def separator_mask(tokens_BT, separator_id: int, mask_BT=None):
  """[B, T] 1 where a step ends (the separator token), 0 elsewhere and on padding."""
  m = tokens_BT == separator_id
  return (m if mask_BT is None else m & (mask_BT > 0)).astype(jnp.int32)


def aggregate(step_rewards_BT, steps_BT, rule: str = "min"):
  """[B] one score per solution from its step rewards (read where `steps_BT` is 1); a row without steps scores
  1 under "min" and "product" (no step is wrong) and 0 under "last"."""
  m = steps_BT > 0
  r = step_rewards_BT.astype(jnp.float32)
  if rule == "min":
    return jnp.min(jnp.where(m, r, 1.0), axis=1)
  if rule == "product":
    return jnp.exp(jnp.sum(jnp.where(m, jnp.log(jnp.maximum(r, 1e-30)), 0.0), axis=1))
  if rule == "last":
    t = r.shape[1]
    last = (t - 1) - jnp.argmax(jnp.flip(m.astype(jnp.int32), axis=1), axis=1)
    return jnp.where(m.any(axis=1), jnp.take_along_axis(r, last[:, None], axis=1)[:, 0], 0.0)
  raise ValueError(f"aggregation must be one of {AGGREGATIONS}, found {rule!r}")


def hidden_states(lm_params, lm_cfg: tfm.Config, tokens_BT, mask_BT=None):
  """The LM's final-normed hidden states [B, T, D], the input of every head."""
  out = tfm.forward(lm_params, tokens_BT, lm_cfg, attention_mask_BT=mask_BT, capture=("hidden_states",))
  return out.hidden_states[-1]
