"""The resumable GRPO loop (arXiv 2402.03300): rollouts, rewards, group advantages, several clipped updates.

One iteration: take P prompts, sample G completions of each in one batch with the current policy (its
per-token log-probs become the old log-probs), score them, normalize rewards within each group, compute the
frozen reference's log-probs once (only when beta > 0), then take `updates_per_batch` optimizer steps on that
batch, each against the same old log-probs. The rollout key is split off the train state's rng, so a
checkpoint (policy, optimizer state, reference params, rng, prompt position) resumes the run bit-exactly.
Each iteration logs reward, KL, clip fraction, entropy and response length to metrics.jsonl and the progress
bar. The step shards like `jaxlab.train.step`: state by the sharding rules, the rollout batch over rows.
Over several processes (`jax.distributed`) every process draws the same prompts, samples and scores the whole
rollout (one program over the global mesh), and feeds its own rows to the update; every process's prompt
position goes into the checkpoint (`jaxlab.train.loop.gather_data_state`).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
import optax

from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.models import transformer as tfm
from jaxlab.rl import grpo as grpo_lib
from jaxlab.rl import rollout as rollout_lib
from jaxlab.train import interrupt, metrics as metrics_lib
from jaxlab.train.loop import NonFiniteError, gather_data_state, local_data_state
from jaxlab.train.state import TrainState, as_train_state
from jaxlab.train.step import jit_train_step, leaf_paths, make_train_step

STATS = ("kl", "clip_frac", "clip_low", "clip_high", "entropy", "ratio")


def make_grpo_step(model_cfg: tfm.Config, gcfg: grpo_lib.GRPOConfig, tx: optax.GradientTransformation, *,
                   compute_dtype=None, forward_fn=None):
  """The (unjitted) GRPO update `step(state, batch) -> (state, metrics)` on a rollout batch (`rollout.as_batch`).

  `jaxlab.train.step.make_train_step` on `losses.grpo_loss_fn`: the loss divided by its weight; a non-finite loss
  or gradient leaves the state untouched. The state's rng is not advanced here: the loop draws rollout keys from it.
  Metrics: loss, grad_norm, weight, finite, finite_leaves and the GRPO statistics `STATS`.
  """
  loss_fn = losses.grpo_loss_fn(model_cfg, beta=gcfg.beta, clip_low=gcfg.clip_low, clip_high=gcfg.clip_high,
                                aggregation=gcfg.aggregation, max_len=gcfg.max_new_tokens,
                                temperature=gcfg.temperature, forward_fn=forward_fn)
  return make_train_step(loss_fn, tx, compute_dtype=compute_dtype, advance_rng=False)


def jit_grpo_step(step_fn, state=None, mesh=None, rules="dp", *, axes=None):
  """`step_fn` jitted like `jaxlab.train.step.jit_train_step` (state donated; sharded on `mesh` by `rules` and the
  params' axis rules `axes`, e.g. `tfm.AXES`)."""
  return jit_train_step(step_fn, state, mesh, rules, axes=axes)


@functools.partial(jax.jit, static_argnames=("cfg", "temperature"))
def _reference_logp(ref_params, prompt, prompt_mask, tokens, cfg, temperature):
  return losses.completion_logprobs(ref_params, cfg, prompt, prompt_mask, tokens, temperature)[0]


@dataclasses.dataclass
class RLResult:
  state: TrainState
  ref_params: Any
  history: list  # the logged records, also written to metrics.jsonl


def _tree(state, ref_params):
  return {"train": state} if ref_params is None else {"train": state, "ref": ref_params}


def restore(checkpointer, state: TrainState, ref_params=None):
  """(iteration, state, ref_params, data_state) from the newest usable checkpoint; None when there is none.

  `state` and `ref_params` are the targets: fresh ones of the same shapes, carrying the shardings to restore to.
  """
  restored = checkpointer.restore_latest(_tree(state, ref_params))
  if restored is None:
    return None
  tree = restored.state
  return restored.step, as_train_state(tree["train"]), tree.get("ref"), restored.data_state


def rl_loop(state: TrainState, model_cfg: tfm.Config, gcfg: grpo_lib.GRPOConfig, train_step,
            prompts: Iterator, reward_fn: Callable, num_iterations: int, *, ref_params=None,
            decode: Callable | None = None, mesh=None, checkpointer=None, ckpt_every: int = 0,
            resume: bool = False, metrics_path: str | None = None, log_every: int = 1,
            metadata: dict | None = None, desc: str = "rl", sample_kw: dict | None = None) -> RLResult:
  """Runs GRPO iterations up to `num_iterations` rollout batches.

  Args:
    state: the policy's TrainState (fresh, or the restore target when resuming).
    model_cfg, gcfg: the model and GRPO configs.
    train_step: jitted step from `make_grpo_step` (+ `jit_grpo_step`).
    prompts: an iterator of lists of P example dicts, with `prompts(batch) -> token lists` and
      `get_state`/`set_state` (e.g. `jaxlab.rl.rollout.PromptCycle`).
    reward_fn: `(texts, examples) -> [B] rewards` (`jaxlab.rl.rewards`).
    num_iterations: total rollout batches to reach.
    ref_params: the frozen reference policy; needed (and checkpointed) only when gcfg.beta > 0.
    decode: token list -> text, for rewards on text and for stop strings.
    mesh: device mesh; the rollout batch is sharded over its rows (B must divide by data * fsdp).
    checkpointer: a `jaxlab.train.checkpoint.Checkpointer`; step numbers are iterations.
    ckpt_every: checkpoint period in iterations (0: only at the end).
    resume: continue from the newest usable checkpoint in `checkpointer`, when there is one.
    metrics_path: metrics.jsonl to append records to.
    log_every: a record every this many iterations (and at the first and last).
    metadata: stored with every checkpoint.
    desc: progress-bar label.
    sample_kw: extra `jaxlab.generate.sample` arguments (e.g. weights).

  Ctrl-C takes effect between iterations, as in `jaxlab.train.loop.train_loop`: the checkpoint being written is
  completed and `checkpointer` closed before KeyboardInterrupt propagates.
  """
  if gcfg.beta > 0 and ref_params is None:
    raise ValueError("GRPO with beta > 0 needs ref_params (the frozen reference policy)")
  ref_params = ref_params if gcfg.beta > 0 else None
  if jax.process_count() > 1 and mesh is None:
    raise ValueError(f"GRPO over {jax.process_count()} processes needs the mesh the state is sharded on (mesh=)")
  start = 0
  if resume and checkpointer is not None:
    got = restore(checkpointer, state, ref_params)
    if got is not None:
      start, state, ref_params, data_state = got
      prompts.set_state(local_data_state(data_state))
  with interrupt.deferred():
    try:
      return _run(state, model_cfg, gcfg, train_step, prompts, reward_fn, num_iterations, ref_params, decode, mesh,
                  checkpointer, ckpt_every, metrics_path, log_every, metadata, desc, dict(sample_kw or {}), start)
    except KeyboardInterrupt:
      if checkpointer is not None:
        checkpointer.close()
      raise


def _run(state, model_cfg, gcfg, train_step, prompts, reward_fn, num_iterations, ref_params, decode, mesh,
         checkpointer, ckpt_every, metrics_path, log_every, metadata, desc, sample_kw, start) -> RLResult:
  paths = leaf_paths(state.params)
  history = []
  t_start = time.time()
  bar = metrics_lib.progress(num_iterations, start, desc)
  with metrics_lib.MetricsWriter(metrics_path) as writer, bar:
    for it in range(start, num_iterations):
      interrupt.check()
      examples = next(prompts)
      rng, key = jax.random.split(state.rng)
      state = state._replace(rng=jax.device_put(rng, state.rng.sharding))
      ro = rollout_lib.sample_rollout(state.params, model_cfg, prompts.prompts(examples), examples,
                                      group_size=gcfg.group_size, max_new_tokens=gcfg.max_new_tokens, key=key,
                                      temperature=gcfg.temperature, top_k=gcfg.top_k, top_p=gcfg.top_p,
                                      stop_tokens=gcfg.stop_tokens, stop_strings=gcfg.stop_strings, decode=decode,
                                      slots=gcfg.rollout_slots or None, **sample_kw)
      rewards = np.asarray(reward_fn(ro.texts, ro.examples), np.float32)
      adv = grpo_lib.group_advantages(rewards, gcfg.group_size, gcfg.scale, gcfg.eps)
      ref_logp = None
      if ref_params is not None:
        ref_logp = _reference_logp(ref_params, ro.prompt, ro.prompt_mask, ro.tokens, model_cfg, gcfg.temperature)
      batch = rollout_lib.as_batch(ro, adv, None if ref_logp is None else shd.to_numpy(ref_logp))
      if mesh is not None:
        batch = shd.shard_batch(shd.process_rows(batch), mesh)
      window = []
      for _ in range(gcfg.updates_per_batch):
        state, m = train_step(state, batch)
        m = jax.device_get(m)
        if not bool(m["finite"]):
          bar.close()
          bad = [p for p, ok in zip(paths, np.asarray(m["finite_leaves"])) if not ok]
          msg = (f"non-finite GRPO update at iteration {it + 1}: loss={float(m['loss'])}, first non-finite "
                 f"gradient leaf {bad[0] if bad else None!r}; stopped without applying or saving it")
          writer.write({"step": it + 1, "event": "non_finite", "message": msg})
          raise NonFiniteError(msg, it + 1, bad[0] if bad else None)
        window.append(m)
      done = it + 1
      last = done == num_iterations
      if checkpointer is not None and (ckpt_every and done % ckpt_every == 0 or last):
        checkpointer.save(done, _tree(state, ref_params), data_state=gather_data_state(prompts.get_state()),
                          metadata=dict(metadata or {}, iteration=done, updates=int(jax.device_get(state.step))))
      if done % log_every == 0 or last or done == start + 1:
        record = {"step": done, "updates": int(jax.device_get(state.step)), "reward": float(rewards.mean()),
                  "reward_std": float(rewards.std()),
                  "response_length": float(np.asarray(ro.completion_mask).sum(axis=1).mean()),
                  "loss": float(np.mean([w["loss"] for w in window])),
                  "grad_norm": float(window[-1]["grad_norm"])}
        record.update({k: float(np.mean([w[k] for w in window])) for k in STATS})
        record["time_s"] = round(time.time() - t_start, 3)
        writer.write(record)
        history.append(record)
        bar.set_postfix({k: f"{record[k]:.4g}" for k in ("reward", "kl", "clip_frac", "entropy", "response_length")},
                        refresh=False)
      if last:
        bar.n = done
      else:
        bar.update(1)
  bar.close()
  if checkpointer is not None:
    checkpointer.wait()
  interrupt.check()
  return RLResult(state, ref_params, history)
