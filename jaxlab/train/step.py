"""The jitted train step of any model: a loss function, gradient accumulation, mixed precision, non-finite guard.

Mixed precision follows Micikevicius et al. (arXiv 1710.03740): fp32 master params are cast to the compute
dtype inside the loss, so gradients flow back to fp32 through the cast; the log-softmax runs in fp32. With
`microbatches > 1` the batch is split row-wise and gradients of the summed loss are accumulated under
`jax.lax.scan`, then divided by the total token count, so the update equals the full-batch one. A step whose
loss or gradient is not finite leaves the state untouched and reports which gradient leaves were non-finite.

The step knows no model: it takes a `jaxlab.losses.LossFn`, `loss_fn(params, batch, rng) -> (loss_sum,
weight, aux)`, the summed loss over the batch, the number of items (tokens) it sums over, and a pytree of
auxiliary outputs (statistics) reported in the metrics. It serves supervised training, RL (`jaxlab.train.rl_loop`)
and any params update of an experiment (a loss that is already a mean returns weight 1, so the update is the
plain one). `lm_loss_fn` and `next_token_nll` are `jaxlab.losses`'s, kept here for existing callers.

Axes: B batch, M microbatches.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.nn import axes as axes_lib
from jaxlab.train.state import TrainState, state_shardings

LossFn = losses.LossFn
next_token_nll = losses.next_token_nll
lm_loss_fn = losses.lm_loss_fn


def cast_floats(tree, dtype):
  """Floating leaves cast to `dtype` (no-op when None or already that dtype)."""
  if dtype is None:
    return tree
  dt = jnp.dtype(dtype)
  return jax.tree.map(lambda x: x.astype(dt) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dt else x,
                      tree)


def leaf_paths(tree) -> list[str]:
  """'/'-joined key paths of the leaves of `tree`, in `jax.tree.leaves` order."""
  return [axes_lib.path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _split_microbatches(batch, m: int, mesh):
  def split(x):
    if x.shape[0] % m:
      raise ValueError(f"batch size {x.shape[0]} is not divisible by microbatches={m}")
    # Microbatch j takes rows j, j + m, ...: each device keeps its own rows (no resharding).
    y = jnp.swapaxes(x.reshape(x.shape[0] // m, m, *x.shape[1:]), 0, 1)
    if mesh is not None:
      y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P(None, shd.BATCH_AXES)))
    return y
  return jax.tree.map(split, batch)


def _with_aux(metrics: dict, aux) -> dict:
  """`metrics` with the loss's aux: a dict's entries alongside (a name clash fails), any other pytree as "aux"."""
  if not isinstance(aux, dict):
    return dict(metrics, aux=aux)
  clash = sorted(set(aux) & set(metrics))
  if clash:
    raise ValueError(f"the loss's aux {clash} would overwrite the train step's metrics of the same names")
  return {**aux, **metrics}


def make_train_step(loss_fn: LossFn, tx: optax.GradientTransformation, *, microbatches: int = 1,
                    compute_dtype=None, schedule: Callable | None = None, mesh=None, advance_rng: bool = True):
  """The (unjitted) train step `step(state, batch) -> (state, metrics)`.

  Args:
    loss_fn: `(params, batch, rng) -> (loss_sum, weight, aux)`.
    tx: the optimizer.
    microbatches: M; the batch's leading dim is split into M parts whose gradients are accumulated.
    compute_dtype: params are cast to this dtype inside the loss (None: use them as stored).
    schedule: step -> learning rate, only reported in the metrics.
    mesh: when given, microbatches are constrained to the batch sharding of this mesh.
    advance_rng: False leaves the state's rng as it was (the loss still gets a key split from it), for loops
      that draw their own keys from it between steps (GRPO's rollouts).

  Returns:
    A function; metrics hold loss (weighted mean), grad_norm, weight (tokens), lr (with `schedule`), finite
    (bool), finite_leaves (bool per gradient leaf, in `leaf_paths(params)` order) and the loss's aux: a dict's
    entries under their own names, any other pytree as "aux"; with M > 1, each aux leaf is the mean over the
    microbatches.
  """
  if microbatches < 1:
    raise ValueError(f"microbatches must be >= 1, found {microbatches}")

  def grads_of(params, batch, rng):
    def f(p):
      loss_sum, weight, aux = loss_fn(cast_floats(p, compute_dtype), batch, rng)
      return loss_sum, (weight, aux)
    (loss_sum, (weight, aux)), grads = jax.value_and_grad(f, has_aux=True)(params)
    return loss_sum, jnp.asarray(weight).astype(jnp.float32), grads, aux

  def step(state: TrainState, batch):
    rng, step_rng = jax.random.split(state.rng)
    params = state.params
    if microbatches == 1:
      loss_sum, weight, grads, aux = grads_of(params, batch, step_rng)
    else:
      mbs = _split_microbatches(batch, microbatches, mesh)

      def body(carry, xs):
        mb, i = xs
        s, w, g, a = grads_of(params, mb, jax.random.fold_in(step_rng, i))
        acc_s, acc_w, acc_g = carry
        return (acc_s + s, acc_w + w, jax.tree.map(jnp.add, acc_g, g)), a
      zeros = jax.tree.map(jnp.zeros_like, params)
      init = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32), zeros)
      (loss_sum, weight, grads), aux_M = jax.lax.scan(body, init, (mbs, jnp.arange(microbatches)))
      aux = jax.tree.map(lambda a: jnp.mean(a, axis=0), aux_M)
    denom = jnp.where(weight > 0, weight, 1.0)
    loss = loss_sum / denom
    grads = jax.tree.map(lambda g: (g / denom).astype(g.dtype), grads)
    finite_leaves = jnp.stack([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])
    finite = jnp.isfinite(loss) & jnp.all(finite_leaves)
    updates, opt_state = tx.update(grads, state.opt_state, params)
    new = TrainState(optax.apply_updates(params, updates), opt_state, state.step + 1,
                     rng if advance_rng else state.rng)
    new = jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads), "weight": weight, "finite": finite,
               "finite_leaves": finite_leaves}
    if schedule is not None:
      metrics["lr"] = jnp.asarray(schedule(state.step), jnp.float32)
    return new, _with_aux(metrics, aux)
  return step


def jit_train_step(step_fn, state=None, mesh=None, rules="dp", *, axes: axes_lib.Rules | None = None):
  """`step_fn` jitted with the state donated; with `mesh`, in/out shardings of the state and batch are fixed.

  Args:
    step_fn: from `make_train_step`.
    state: a TrainState (arrays or ShapeDtypeStructs) giving the tree structure; needed with `mesh`.
    mesh: device mesh; None jits without sharding annotations.
    rules: sharding strategy for the state.
    axes: the params' logical axis rules (e.g. `tfm.AXES`); needed with `mesh`.
  """
  if mesh is None:
    return jax.jit(step_fn, donate_argnums=0)
  if state is None:
    raise ValueError("jit_train_step with a mesh needs the state (or its abstract shapes)")
  sh = state_shardings(state, mesh, rules, axes=axes_lib.require(axes, "jit_train_step on a mesh"))
  rep = NamedSharding(mesh, P())
  return jax.jit(step_fn, in_shardings=(sh, shd.batch_sharding(mesh)), out_shardings=(sh, rep),
                 donate_argnums=0)


def make_eval_step(loss_fn: LossFn, compute_dtype=None):
  """Jitted `eval_step(params, batch) -> (loss_sum, weight)` (placement follows the inputs' shardings; the loss's
  aux is dropped)."""
  def eval_step(params, batch):
    s, w, _ = loss_fn(cast_floats(params, compute_dtype), batch, jax.random.PRNGKey(0))
    return s, jnp.asarray(w).astype(jnp.float32)
  return jax.jit(eval_step)
