"""Tele-Lens probes of latent planning (arXiv 2602.02103, "How Far Ahead Do LLMs Plan?"; lxucs/tele-lens).

A probe reads one hidden state h of a frozen LM (any layer, HF convention: 0 = embeddings, n_layers = the
final-normed state) through a low-rank adapter with no residual,

  h~ = act((h + E[delta]) A) B * alpha / r,

and then through the frozen LM head (optionally restricted to a vocabulary subset: candidate token ids) or a
scalar regression head. Targets ("kind"):
  tokens  the token delta = 1..horizon positions ahead (delta 1 = the next token, which the LM itself predicts);
          E is an offset embedding with horizon + 1 rows (row 0 unused), so one probe serves every delta;
  answer  the final answer's token (no offset);
  length  the remaining CoT length in tokens (mean squared error; no offset).
A and B start as PyTorch's kaiming-uniform (U(+-1/sqrt(fan_in))), E as N(0, 1), the length head at zero.

Features are extracted once from the frozen model (`extract`, through a truncated layer program of
`jaxlab.models.programs`, so every layer shares one compile) and cached as .npz files keyed by the model's
name, the layer, the token sequences and the positions (`extract_cached`). Training is a jitted optax step over
fixed-shape batches (weights 0 pad the last one), shardable over a mesh's batch axes.

Uncertainty read-outs: token entropy, pivot uncertainty (the mean of the k lowest entropies of a CoT, the
paper's sparse pivot positions, k = 5), self-certainty (mean KL(uniform || p)), perplexity, and AUROC
(Mann-Whitney, ties counted one half).

Axes: N examples, B batch, T positions, D model, r rank, M horizon (deltas), V vocabulary (subset).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from typing import Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab import choices, sharding
from jaxlab.models import programs
from jaxlab.models import transformer as tfm
from jaxlab.nn import axes, layers

Kind = Literal["tokens", "answer", "length"]
KINDS = choices.values(Kind)
Activation = Literal["none", "relu", "gelu", "silu", "tanh"]
ACTIVATIONS = choices.values(Activation)
Schedule = Literal["constant", "linear"]
IGNORE = -1  # target id of a masked (token, delta) pair


def _fail(msg):
  raise ValueError(f"probes.Config: {msg}")


@dataclasses.dataclass(frozen=True)
class Config:
  d_model: int = 64
  rank: int = 256
  alpha: float = 256.0
  activation: Activation = "silu"
  kind: Kind = "tokens"
  horizon: int = 8
  learning_rate: float = 1e-3
  schedule: Schedule = "constant"  # "linear": decays to 0 over `decay_steps` (`train` sets them to its step count)
  decay_steps: int = 0
  param_dtype: layers.DType = "float32"

  def __post_init__(self):
    if self.d_model <= 0 or self.rank <= 0 or self.horizon <= 0:
      _fail(f"d_model, rank and horizon must be positive, found {self.d_model}, {self.rank}, {self.horizon}")
    if self.decay_steps < 0:
      _fail(f"decay_steps must be >= 0, found {self.decay_steps}")
    layers.check_dtype_names(self, _fail, ("param_dtype",))
    choices.check(self, _fail, nested=False)

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


# The paper's probe (r 256, lr 1e-3, 8 tokens ahead); d_model comes from the probed LM.
PRESETS = {"tele-lens": Config(rank=256, alpha=256.0, horizon=8, learning_rate=1e-3),
           "tiny": Config(rank=16, alpha=16.0, horizon=8, learning_rate=1e-2)}

AXES = axes.rules(
    (r"lens_offset/embedding", ("pos", "embed"), None),
    (r"lens_a/kernel", ("embed", "rank"), "embed"),
    (r"lens_b/kernel", ("rank", "embed"), "rank"),
    (r"lens_length/kernel", ("embed", "classes"), "embed"),
    (r"lens_length/bias", ("classes",), None),
)


def init(cfg: Config, key) -> dict:
  """{"lens_a", "lens_b"} plus "lens_offset" (tokens) or "lens_length" (length)."""
  dt = jnp.dtype(cfg.param_dtype)
  ka, kb, ke = jax.random.split(key, 3)
  uniform = lambda k, shape, fan_in: jax.random.uniform(k, shape, jnp.float32, -1, 1).astype(dt) / np.sqrt(fan_in)
  params = {"lens_a": {"kernel": uniform(ka, (cfg.d_model, cfg.rank), cfg.d_model)},
            "lens_b": {"kernel": uniform(kb, (cfg.rank, cfg.d_model), cfg.rank)}}
  if cfg.kind == "tokens":
    params["lens_offset"] = {"embedding": jax.random.normal(ke, (cfg.horizon + 1, cfg.d_model)).astype(dt)}
  if cfg.kind == "length":
    params["lens_length"] = {"kernel": jnp.zeros((cfg.d_model, 1), dt), "bias": jnp.zeros((1,), dt)}
  return params


def param_axes(cfg: Config):
  return axes.logical_axes(jax.eval_shape(lambda: init(cfg, jax.random.key(0))), AXES)


def _act(name, x):
  return {"none": lambda v: v, "relu": jax.nn.relu, "gelu": lambda v: jax.nn.gelu(v, approximate=False),
          "silu": jax.nn.silu, "tanh": jnp.tanh}[name](x)


def adapt(params, cfg: Config, h_ND):
  """h~ [N, (M,) D]: the adapter on h (tokens: one row per delta 1..horizon, M = horizon)."""
  x = h_ND.astype(jnp.float32)
  if cfg.kind == "tokens":
    x = x[..., None, :] + params["lens_offset"]["embedding"][1:].astype(jnp.float32)
  z = _act(cfg.activation, layers.linear(params["lens_a"], x, jnp.float32))
  return layers.linear(params["lens_b"], z, jnp.float32) * cfg.scale


def forward(params, cfg: Config, h_ND, head_DV=None):
  """tokens: logits [N, M, V]; answer: logits [N, V]; length: predicted remaining length [N]."""
  if h_ND.shape[-1] != cfg.d_model:
    raise ValueError(f"features must end in d_model={cfg.d_model}, found shape {h_ND.shape}")
  z = adapt(params, cfg, h_ND)
  if cfg.kind == "length":
    return layers.linear(params["lens_length"], z, jnp.float32)[..., 0]
  if head_DV is None:
    raise ValueError(f"a {cfg.kind} probe reads out through the LM head: pass head_DV [D, V]")
  return jnp.einsum("...d,dv->...v", z, head_DV.astype(jnp.float32))


def lm_head(params, vocab_ids: Sequence[int] | None = None):
  """The frozen read-out [D, V] of a jaxlab transformer (lm_head, or the tied embedding), columns `vocab_ids`."""
  head = params["lm_head"]["kernel"] if "lm_head" in params else params["embed"]["embedding"].T
  return head if vocab_ids is None else jnp.asarray(head)[:, np.asarray(vocab_ids, np.int32)]


def to_subset(token_ids, vocab_ids):
  """Token ids -> their column in `vocab_ids` (IGNORE where absent or already IGNORE)."""
  vocab_ids = np.asarray(vocab_ids, np.int64)
  order = np.argsort(vocab_ids, kind="stable")
  ids = np.asarray(token_ids, np.int64)
  at = np.clip(np.searchsorted(vocab_ids[order], ids), 0, len(vocab_ids) - 1)
  hit = (vocab_ids[order][at] == ids) & (ids >= 0)
  return np.where(hit, order[at], IGNORE).astype(np.int32)


# --------------------------------------------------------------------------------------------- targets

def token_targets(sequences: Sequence[Sequence[int]], positions, horizon: int, ends=None) -> np.ndarray:
  """[N, horizon] token ids `delta` = 1..horizon after each (row, position) pair; IGNORE past the end.

  Args:
    ends: per row, the exclusive end of what may be a target (e.g. the end of the CoT); default the length.
  """
  positions = _check_positions(sequences, positions)
  out = np.full((len(positions), horizon), IGNORE, np.int32)
  for i, (r, t) in enumerate(positions):
    end = len(sequences[r]) if ends is None else int(ends[r])
    for d in range(1, horizon + 1):
      if t + d < end:
        out[i, d - 1] = sequences[r][t + d]
  return out


def _check_positions(sequences, positions) -> np.ndarray:
  pos = np.asarray(positions, np.int64).reshape(-1, 2)
  for r, t in pos:
    if not 0 <= r < len(sequences) or not 0 <= t < len(sequences[r]):
      raise ValueError(f"position pair (row {r}, position {t}) is outside the {len(sequences)} sequences "
                       f"(row {r} has {len(sequences[r]) if 0 <= r < len(sequences) else 0} tokens)")
  return pos


# -------------------------------------------------------------------------------------- feature extraction

@functools.lru_cache(maxsize=16)
def _hidden_fn(cfg: tfm.Config):
  @jax.jit
  def fn(params, tokens_BT, mask_BT, program_P):
    out = programs.forward(params, tokens_BT, cfg, program_P, attention_mask_BT=mask_BT)
    return out.residual, layers.rms_norm(params["final_norm"], out.residual, cfg.norm_eps)
  return fn


def extract(params, cfg: tfm.Config, sequences: Sequence[Sequence[int]], layer: int, positions, *,
            batch_size: int = 8, bucket: int = 32, pad_id: int = 0) -> np.ndarray:
  """float32 [N, D] hidden state `layer` (HF convention) at each (row, position) pair of `positions`.

  Runs only the first `layer` layers (a truncated padded program: one compile for every layer); sequences are
  right-padded to a multiple of `bucket` in batches of `batch_size` rows, so a causal LM never sees padding.
  """
  if not 0 <= layer <= cfg.n_layers:
    raise ValueError(f"layer must be in [0, {cfg.n_layers}] (hidden states of the LM), found {layer}")
  pos = _check_positions(sequences, positions)
  fn = _hidden_fn(cfg)
  program = programs.truncated(layer, cfg.n_layers)
  rows = np.unique(pos[:, 0])
  out = np.zeros((len(pos), cfg.d_model), np.float32)
  for i in range(0, len(rows), batch_size):
    batch = rows[i:i + batch_size]
    t = -(-max(len(sequences[r]) for r in batch) // bucket) * bucket
    tok = np.full((batch_size, t), pad_id, np.int32)
    mask = np.zeros((batch_size, t), np.int32)
    for b, r in enumerate(batch):
      tok[b, :len(sequences[r])], mask[b, :len(sequences[r])] = sequences[r], 1
    residual, normed = fn(params, tok, mask, program)
    hs = np.asarray(normed if layer == cfg.n_layers else residual, np.float32)
    for b, r in enumerate(batch):
      sel = np.nonzero(pos[:, 0] == r)[0]
      out[sel] = hs[b, pos[sel, 1]]
  return out


def cache_key(model: str, layer: int, sequences: Sequence[Sequence[int]], positions) -> str:
  """A file-name-safe key: the model's name, the layer and a digest of the token sequences and positions."""
  h = hashlib.sha256()
  for seq in sequences:
    arr = np.asarray(seq, np.int64)
    h.update(np.int64(arr.size).tobytes() + arr.tobytes())
  h.update(np.asarray(positions, np.int64).reshape(-1, 2).tobytes())
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)
  return f"{safe}-layer{int(layer)}-{h.hexdigest()[:24]}"


def extract_cached(cache_dir: str, model: str, params, cfg: tfm.Config, sequences, layer: int, positions,
                   **kw) -> np.ndarray:
  """`extract`, read from `cache_dir/<cache_key>.npz` when present, else computed and written there.

  Args:
    model: names the frozen model's weights (a different checkpoint needs a different name).
  """
  path = os.path.join(cache_dir, cache_key(model, layer, sequences, positions) + ".npz")
  pos = np.asarray(positions, np.int64).reshape(-1, 2)
  if os.path.exists(path):
    with np.load(path) as f:
      meta = json.loads(str(f["meta"]))
      if meta["model"] != model or meta["layer"] != layer or not np.array_equal(f["positions"], pos):
        raise ValueError(f"{path}: cached for {meta['model']!r} layer {meta['layer']}, asked for {model!r} "
                         f"layer {layer} (or other positions)")
      return np.asarray(f["features"])
  feats = extract(params, cfg, sequences, layer, positions, **kw)
  os.makedirs(cache_dir, exist_ok=True)
  tmp = path[:-4] + ".tmp.npz"
  np.savez(tmp, features=feats, positions=pos, meta=json.dumps({"model": model, "layer": int(layer)}))
  os.replace(tmp, path)
  return feats


# -------------------------------------------------------------------------------------------- training

def loss_fn(params, cfg: Config, batch, head_DV=None):
  """Weighted mean loss of a batch {"h": [B, D], "y": targets, "w": [B] weights}.

  y: tokens [B, M] ids in the head's columns (IGNORE masked); answer [B] ids; length [B] floats.
  """
  pred = forward(params, cfg, batch["h"], head_DV)
  w = batch["w"].astype(jnp.float32)
  if cfg.kind == "length":
    err = jnp.square(pred - batch["y"].astype(jnp.float32))
    return jnp.sum(w * err) / jnp.maximum(jnp.sum(w), 1e-9)
  y = batch["y"]
  valid = (y != IGNORE).astype(jnp.float32) * (w[:, None] if cfg.kind == "tokens" else w)
  ce = optax.softmax_cross_entropy_with_integer_labels(pred, jnp.maximum(y, 0))
  return jnp.sum(valid * ce) / jnp.maximum(jnp.sum(valid), 1e-9)


def optimizer(cfg: Config) -> optax.GradientTransformation:
  """Adam at `learning_rate`, constant or decayed linearly to 0 over `decay_steps`."""
  if cfg.schedule == "linear":
    return optax.adam(optax.linear_schedule(cfg.learning_rate, 0.0, max(cfg.decay_steps, 1)))
  return optax.adam(cfg.learning_rate)


def make_train_step(cfg: Config, tx: optax.GradientTransformation):
  """A jitted `step(params, opt_state, batch, head_DV) -> (params, opt_state, loss)` (params, state donated)."""
  def step(params, opt_state, batch, head_DV):
    loss, grads = jax.value_and_grad(loss_fn)(params, cfg, batch, head_DV)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return jax.jit(step, donate_argnums=(0, 1))


@functools.lru_cache(maxsize=32)
def _train_step(cfg: Config):
  return make_train_step(cfg, optimizer(cfg))


def batches(h_ND, y, batch_size: int, rng: np.random.Generator | None = None):
  """Fixed-shape batches {"h", "y", "w"} over all rows (shuffled by `rng`); the last is padded with w = 0."""
  h_ND, y = np.asarray(h_ND, np.float32), np.asarray(y)
  n = len(h_ND)
  if n == 0 or len(y) != n:
    raise ValueError(f"need as many targets as features (> 0), found {len(y)} targets for {n} features")
  order = np.arange(n) if rng is None else rng.permutation(n)
  for i in range(0, n, batch_size):
    idx = order[i:i + batch_size]
    pad = batch_size - len(idx)
    w = np.concatenate([np.ones(len(idx), np.float32), np.zeros(pad, np.float32)])
    idx = np.concatenate([idx, np.repeat(idx[:1], pad)])
    yield {"h": h_ND[idx], "y": y[idx], "w": w}


def train(cfg: Config, h_ND, y, *, head_DV=None, epochs: int = 10, batch_size: int = 64, seed: int = 0,
          mesh=None, params=None):
  """Trains a probe on cached features; returns (params, per-step losses). With `mesh`, batches are sharded
  over its batch axes and the probe and head replicated."""
  params = init(cfg, jax.random.key(seed)) if params is None else params
  if cfg.schedule == "linear":
    cfg = cfg.replace(decay_steps=epochs * -(-len(h_ND) // batch_size))
  tx = optimizer(cfg)
  if mesh is not None:
    params = sharding.shard_params(params, mesh, "dp", axes=AXES)
    if head_DV is not None:
      head_DV = jax.device_put(head_DV, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  opt_state = tx.init(params)
  step = _train_step(cfg)
  rng = np.random.default_rng(seed)
  losses = []
  for _ in range(epochs):
    for b in batches(h_ND, y, batch_size, rng):
      b = sharding.shard_batch(b, mesh) if mesh is not None else jax.tree.map(jnp.asarray, b)
      params, opt_state, loss = step(params, opt_state, b, head_DV)
      losses.append(float(loss))
  return params, losses


# ------------------------------------------------------------------------------------------ evaluation

@functools.lru_cache(maxsize=32)
def _predict_fn(cfg: Config, top_k: int | None):
  if top_k is None:
    return jax.jit(lambda p, h, head: forward(p, cfg, h, head))
  return jax.jit(lambda p, h, head: jax.lax.top_k(forward(p, cfg, h, head), top_k)[1])


def predict(params, cfg: Config, h_ND, head_DV=None, batch_size: int = 256, top_k: int | None = None) -> np.ndarray:
  """`forward` over all rows in fixed-shape batches (NumPy float32); with `top_k`, only the ids of each row's
  k largest logits [N, (M,) k] (largest first, the lower id first on ties), so a full-vocabulary read-out never
  leaves the device."""
  h_ND = np.asarray(h_ND, np.float32)
  out = []
  for i in range(0, len(h_ND), batch_size):
    part = h_ND[i:i + batch_size]
    padded = np.concatenate([part, np.zeros((batch_size - len(part), h_ND.shape[1]), np.float32)])
    out.append(np.asarray(_predict_fn(cfg, top_k)(params, jnp.asarray(padded), head_DV))[:len(part)])
  return np.concatenate(out)


def topk_accuracy(logits, targets, k: int = 5, *, top_ids=None) -> np.ndarray:
  """Mean over valid rows of target-in-top-k, per trailing target axis: logits [N, (M,) V] (or `top_ids`
  [N, (M,) k] from `predict(..., top_k=k)`, logits None), targets [N, (M,)]; NaN where a column has no valid
  target. Ties rank the lower id first."""
  targets = np.asarray(targets)
  top = np.asarray(top_ids) if top_ids is not None else np.argsort(-np.asarray(logits), -1, kind="stable")[..., :k]
  hit = (top == targets[..., None]).any(-1)
  valid = targets != IGNORE
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.sum(hit & valid, axis=0) / np.sum(valid, axis=0)


def entropy(logits, axis: int = -1):
  """Shannon entropy (nats) of softmax(logits)."""
  logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=axis)
  return -jnp.sum(jnp.exp(logp) * logp, axis=axis)


def pivot_uncertainty(entropy_BT, mask_BT, k: int = 5, highest: bool = False):
  """[B] mean of the k lowest entropies among each row's masked-in positions (fewer if a row has fewer); with
  `highest`, of the k highest (Tele-Lens's top-k-highest-entropy baseline)."""
  sign = -1.0 if highest else 1.0
  e = jnp.where(jnp.asarray(mask_BT, bool), sign * jnp.asarray(entropy_BT, jnp.float32), jnp.inf)
  low = -jax.lax.top_k(-e, min(k, e.shape[-1]))[0]
  finite = jnp.isfinite(low)
  return sign * jnp.sum(jnp.where(finite, low, 0.0), -1) / jnp.maximum(jnp.sum(finite, -1), 1)


def self_certainty(logits_BTV, mask_BT):
  """[B] mean over masked-in positions of KL(uniform || softmax(logits)) (higher = more certain)."""
  logp = jax.nn.log_softmax(jnp.asarray(logits_BTV, jnp.float32), axis=-1)
  kl = -jnp.mean(logp, -1) - jnp.log(logp.shape[-1])
  m = jnp.asarray(mask_BT, jnp.float32)
  return jnp.sum(kl * m, -1) / jnp.maximum(jnp.sum(m, -1), 1)


def perplexity(token_logprobs_BT, mask_BT):
  """[B] exp of the mean negative log-probability of the sampled tokens."""
  m = jnp.asarray(mask_BT, jnp.float32)
  return jnp.exp(-jnp.sum(jnp.asarray(token_logprobs_BT, jnp.float32) * m, -1) / jnp.maximum(jnp.sum(m, -1), 1))


def auroc(scores, labels) -> float:
  """Area under the ROC curve of `scores` for binary `labels` (1 = positive), ties counting one half."""
  s, y = np.asarray(scores, np.float64).reshape(-1), np.asarray(labels).reshape(-1).astype(bool)
  if s.shape != y.shape or y.all() or not y.any():
    raise ValueError(f"auroc needs one score per label and both classes, found {s.size} scores, "
                     f"{int(y.sum())} positives of {y.size} labels")
  order = np.argsort(s, kind="stable")
  ranks = np.empty(len(s), np.float64)
  sorted_s = s[order]
  starts = np.r_[0, np.nonzero(np.diff(sorted_s))[0] + 1]
  ends = np.r_[starts[1:], len(s)]
  for a, b in zip(starts, ends):
    ranks[order[a:b]] = (a + b + 1) / 2.0  # average 1-based rank of a tie group
  n_pos, n_neg = int(y.sum()), int((~y).sum())
  return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
