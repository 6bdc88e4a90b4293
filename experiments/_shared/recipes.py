"""The training recipe the experiments share: byte-level model config, optimizer, and the train assembly.

`optimizer` is global-norm clipping (when `grad_clip > 0`) chained before any `jaxlab.optim` optimizer at a
learning rate or schedule (warmup-cosine from `jaxlab.train.schedules`, or any optax schedule). `train_step`
makes the model-agnostic step from a `jaxlab.losses.LossFn` and jits it (state donated, sharded with a mesh);
`fit` runs it in `jaxlab.train.loop.train_loop`.
"""
from __future__ import annotations

import optax

from jaxlab import optim
from jaxlab.models import transformer as tfm
from jaxlab.train import loop as loop_lib
from jaxlab.train import step as step_lib


def byte_model(d: int, layers: int, heads: int, ff: int, maxlen: int = 128) -> tfm.Config:
  """A LLaMA-style config over byte tokens (256 bytes + bos 256, eos 257, pad 258; vocab 264)."""
  return tfm.Config(vocab_size=264, d_model=d, n_layers=layers, n_heads=heads, d_ff=ff,
                    max_position_embeddings=maxlen, bos_token_id=256, eos_token_id=257, pad_token_id=258)


def optimizer(learning_rate: optax.ScalarOrSchedule, name: str = "adamw", grad_clip: float = 0.0, *,
              axes=None, **hp) -> optax.GradientTransformation:
  """`clip_by_global_norm(grad_clip)` (skipped at 0) then `jaxlab.optim.get(name, learning_rate, axes=axes, **hp)`.

  Args:
    learning_rate: a float or a schedule `step -> lr`.
    name: one of `jaxlab.optim.names()`.
    grad_clip: max global gradient norm; 0 for no clipping.
    axes: the params' logical axis rules (e.g. `tfm.AXES`), for every optimizer but adamw.
    **hp: the optimizer's hyperparameters (e.g. b1, b2, weight_decay for adamw).
  """
  tx = optim.get(name, learning_rate, axes=axes, **hp)
  return optax.chain(optax.clip_by_global_norm(grad_clip), tx) if grad_clip > 0 else tx


def compute_dtype(model: tfm.Config):
  """The dtype params are cast to inside the loss: the model's `dtype` when it differs from `param_dtype`."""
  return model.dtype if model.dtype != model.param_dtype else None


def train_step(loss_fn, tx: optax.GradientTransformation, state=None, mesh=None, strategy: str = "dp", *,
               axes=None, microbatches: int = 1, compute: str | None = None, schedule=None):
  """`jit_train_step(make_train_step(loss_fn, tx, ...), state, mesh, strategy, axes=axes)`.

  Args:
    loss_fn: a `jaxlab.losses.LossFn`.
    tx: the optimizer.
    state: the TrainState (its structure shards the jitted step; needed with `mesh`).
    mesh: device mesh or None.
    strategy: sharding rules of the state.
    axes: the params' logical axis rules (e.g. `tfm.AXES`); needed with `mesh`.
    microbatches, schedule: as in `make_train_step`.
    compute: the compute dtype (`compute_dtype(model)`).
  """
  fn = step_lib.make_train_step(loss_fn, tx, microbatches=microbatches, compute_dtype=compute, schedule=schedule,
                                mesh=mesh)
  return step_lib.jit_train_step(fn, state, mesh, strategy, axes=axes)


def fit(state, loss_fn, tx: optax.GradientTransformation, batches, steps: int, *, mesh=None, strategy: str = "dp",
        axes=None, microbatches: int = 1, compute: str | None = None, schedule=None, **loop_kw):
  """`train_step(...)` run for `steps` by `train_loop(state, step, batches, steps, **loop_kw)`.

  Returns:
    (LoopResult, the jitted step).
  """
  step = train_step(loss_fn, tx, state, mesh, strategy, axes=axes, microbatches=microbatches, compute=compute,
                    schedule=schedule)
  return loop_lib.train_loop(state, step, batches, steps, **loop_kw), step
