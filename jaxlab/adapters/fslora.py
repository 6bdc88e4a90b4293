"""Federated Sketching LoRA (FSLoRA, arXiv:2501.19389) with the FedLoRA, HetLoRA-style zero-padding, SVD
(FlexLoRA) and stacking (FLoRA) baselines of its reference repository, as a federated simulation over any model:
the caller supplies `loss_fn(effective_params, batch)`.

The server keeps a global LoRA per target (`lora` layout: lora_a [.., in, r] = A^T, lora_b [.., r, out] = B^T of
the paper's B [m, r], A [r, n]) with rsLoRA scale s = alpha/sqrt(r). Each round `plan_round` samples C of the N
clients, each one's index set I_i (|I_i| = k_i) and its minibatch indices; the round function trains the sampled
clients in one vmapped program for H local steps (AdamW, or SGD with momentum 0.9 as in the authors' code; the
rate constant, or cosine-decayed over `decay_rounds` rounds) from the global LoRA and aggregates:

  fslora:  I_i uniform of size k_i, S_i = (r/k_i) diag(1_{I_i}) (E[S_i] = I); client model W0 + s B S_i A.
  fedlora: k_i = r, S_i = I.
  hetlora: client rank r_i = k_i trains the first k_i components, S_i = diag(1_{I_i}) (its truncated copy of the
           global LoRA), and the server averages with zero padding.
  flexlora: client rank r_i = k_i at its own rsLoRA scale alpha/sqrt(r_i) (S_i = sqrt(r/r_i) diag(1_{I_i})),
           starting from the best rank-r_i approximation of the global update; the server averages the clients'
           full updates, D = mean_i s B_i S_i A_i, and keeps its rank-r SVD truncation as the global LoRA (the
           reference's `LoRA_SVD.py`: singular values on B).
  flora:   every round each client trains a fresh LoRA (A kaiming-uniform, B zero) of rank r_i at scale
           alpha/sqrt(r_i) on the current global model, the server stacks them, which adds exactly their mean
           update D to the global weights (`State.merged`), and the next round starts from the merged model (the
           reference's `LoRA_Stack.py`, whose stacked adapter is scaled by alpha/sqrt(sum r_i) instead: the
           clients' mean update times sqrt(r_i / sum r_i)).

A client touches only columns I_i of B and rows I_i of A (outside I_i the sketched forward has zero gradient and
updates are masked, so weight decay cannot move them) and uploads only those submatrices. The server treats
g = -mean_i(delta_i) (zero where a client did not touch) as a pseudo-gradient for its optimizer (SGD with lr 1 is
FedAvg; flexlora and flora replace the global update instead and use no server optimizer). With `reweight`, each
rank component is instead averaged over the clients that trained it this round (HeteroFL-style): with a
scale-invariant client optimizer (AdamW normalizes away the r/k that the sketch puts into the gradient) the plain
mean moves a component by about k/r of a client step per round, this by one.
Index sets are 0/1 masks of length r, so all clients share one compiled program; in this simulation a client's
compute is therefore that of rank r, while its upload is counted from k_i:
k_i * sum_targets (#stacked layers) * (in + out) * itemsize bytes.

Axes: N clients, C sampled clients, H local steps, b batch, r rank.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab import choices
from jaxlab.adapters import lora

Method = Literal["fslora", "fedlora", "hetlora", "flexlora", "flora"]
METHODS = choices.values(Method)
LocalOpt = Literal["adamw", "sgd"]  # sgd: momentum 0.9 (the sketch's r/k gradient scale then survives)
ServerOpt = Literal["sgd", "adam"]


@dataclasses.dataclass(frozen=True)
class Config:
  method: Method = "fslora"
  rank: int = 8
  alpha: float = 16.0
  targets: tuple[str, ...] = ("q", "v")
  n_clients: int = 50
  clients_per_round: int = 10
  local_steps: int = 5  # H
  batch_size: int = 8
  local_lr: float = 1e-3
  decay_rounds: int = 0  # > 0: round t's client lr is local_lr * cosine(t / decay_rounds) down to 0.1x; 0: constant
  local_weight_decay: float = 0.0
  local_opt: LocalOpt = "adamw"
  server_lr: float = 1.0
  server_opt: ServerOpt = "sgd"
  reweight: bool = False  # the server averages each component over the clients that trained it (module doc)
  ratios: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)  # k_i / r, client i takes ratios[i % len]; fedlora: all 1

  def __post_init__(self):
    for name in ("targets", "ratios"):
      v = getattr(self, name)
      if not isinstance(v, tuple):
        object.__setattr__(self, name, (v,) if isinstance(v, (str, int, float)) else tuple(v))

    def bad(msg):
      raise ValueError(f"fslora.Config: {msg}")
    choices.check(self, bad, nested=False)
    if self.decay_rounds < 0:
      bad(f"decay_rounds must be >= 0, found {self.decay_rounds}")
    for name in ("rank", "n_clients", "clients_per_round", "local_steps", "batch_size"):
      if getattr(self, name) <= 0:
        bad(f"{name} must be positive, found {getattr(self, name)}")
    if self.clients_per_round > self.n_clients:
      bad(f"clients_per_round ({self.clients_per_round}) must be <= n_clients ({self.n_clients})")
    if not self.ratios or any(not 0 < q <= 1 for q in self.ratios):
      bad(f"ratios must be non-empty and in (0, 1], found {self.ratios}")
    self.lora()

  def lora(self) -> lora.Config:
    return lora.Config(rank=self.rank, alpha=self.alpha, targets=self.targets, rslora=True)

  def client_k(self) -> np.ndarray:
    """k_i for every client (sketch size for fslora, client rank for hetlora, r for fedlora)."""
    if self.method == "fedlora":
      return np.full(self.n_clients, self.rank, np.int32)
    q = np.asarray([self.ratios[i % len(self.ratios)] for i in range(self.n_clients)])
    return np.clip(np.round(q * self.rank), 1, self.rank).astype(np.int32)

  def round_lr(self, round_index):
    """The clients' learning rate in round `round_index` (0-based; may be traced)."""
    if not self.decay_rounds:
      return jnp.asarray(self.local_lr, jnp.float32)
    return optax.cosine_decay_schedule(self.local_lr, self.decay_rounds, alpha=0.1)(round_index)

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


class Plan(NamedTuple):
  clients: Any  # [C] int32 client ids
  mask: Any  # [C, r] float32, 1 on I_i
  factor: Any  # [C] float32, r/k_i for fslora, sqrt(r/k_i) for flexlora and flora, else 1
  batch_idx: Any  # [C, H, b] int32 example indices into each client's data
  init_key: Any  # flora: the key of the round's fresh client LoRA


class State(NamedTuple):
  adapter: dict
  opt_state: Any
  round: Any
  merged: dict = {}  # flora: path -> the [.., in, out] updates merged into the global weights so far


def random_mask(key, r: int, k):
  """The 0/1 indicator of a uniformly random k-subset of range(r) (k may be traced)."""
  perm = jax.random.permutation(key, r)
  return jnp.zeros((r,), jnp.float32).at[perm].set((jnp.arange(r) < k).astype(jnp.float32))


def sketch(mask, k, r: int):
  """S = (r/k) diag(mask)."""
  return jnp.diag(mask * (r / k))


def plan_round(cfg: Config, key, sizes) -> Plan:
  """Samples the round's clients (without replacement), their index sets and minibatch indices.

  The client draw and batch indices use keys independent of the method, so methods given the same key see the
  same clients and data.

  Args:
    cfg: the federation config.
    key: PRNG key of this round.
    sizes: [N] number of examples each client holds.
  """
  return _plan(cfg, key, jnp.asarray(sizes, jnp.int32))


@functools.partial(jax.jit, static_argnums=0)
def _plan(cfg: Config, key, sizes):
  C, r = cfg.clients_per_round, cfg.rank
  kc, km, kb = jax.random.split(key, 3)
  clients = jax.random.choice(kc, cfg.n_clients, (C,), replace=False).astype(jnp.int32)
  k = jnp.asarray(cfg.client_k())[clients]
  if cfg.method == "fslora":
    mask = jax.vmap(lambda kk, ki: random_mask(kk, r, ki))(jax.random.split(km, C), k)
    factor = r / k.astype(jnp.float32)
  else:
    mask = (jnp.arange(r)[None, :] < k[:, None]).astype(jnp.float32)
    own_scale = cfg.method in ("flexlora", "flora")
    factor = jnp.sqrt(r / k.astype(jnp.float32)) if own_scale else jnp.ones((C,), jnp.float32)
  n = sizes[clients][:, None, None]
  u = jax.random.uniform(kb, (C, cfg.local_steps, cfg.batch_size))
  idx = jnp.minimum(jnp.floor(u * n).astype(jnp.int32), n - 1)
  return Plan(clients, mask, factor, idx, jax.random.fold_in(key, 3))


def sketched(adapter, mask, factor):
  """The client's adapter with S folded into lora_a: A^T diag(factor * mask)."""
  return {p: {"lora_a": l["lora_a"] * (factor * mask).astype(l["lora_a"].dtype), "lora_b": l["lora_b"]}
          for p, l in adapter.items()}


def _per_component(adapter, w_r):
  """Every rank component (lora_a's column, lora_b's row) times w_r [r]: a 0/1 mask or a weight."""
  return {p: {"lora_a": l["lora_a"] * w_r.astype(l["lora_a"].dtype),
              "lora_b": l["lora_b"] * w_r[:, None].astype(l["lora_b"].dtype)} for p, l in adapter.items()}


def client_update(cfg: Config, loss_fn: Callable, adapter, base_params, data, mask, factor, batch_idx, lr=None):
  """H local steps (cfg.local_opt) of one client on W0 + s B S A, updating only the components in `mask`.

  Args:
    cfg: the federation config.
    loss_fn: loss_fn(effective_params, batch) -> scalar.
    adapter: the global LoRA the client starts from.
    base_params: frozen base params.
    data: this client's examples (pytree of [n_max, ...] arrays).
    mask: [r] 0/1 index set; factor: scalar r/k (1 for fedlora/hetlora).
    batch_idx: [H, b] example indices.
    lr: this round's learning rate (default cfg.local_lr).

  Returns:
    (new adapter, [H] losses before each step).
  """
  lcfg = cfg.lora()
  lr = cfg.local_lr if lr is None else lr
  if cfg.local_opt == "adamw":
    tx = optax.adamw(lr, weight_decay=cfg.local_weight_decay)
  else:
    tx = optax.chain(optax.add_decayed_weights(cfg.local_weight_decay), optax.sgd(lr, momentum=0.9))

  def loss(ad, batch):
    return loss_fn(lora.merge(base_params, sketched(ad, mask, factor), lcfg), batch)

  def step(carry, idx):
    ad, opt = carry
    batch = jax.tree.map(lambda x: x[idx], data)
    value, grads = jax.value_and_grad(loss)(ad, batch)
    updates, opt = tx.update(grads, opt, ad)
    return (optax.apply_updates(ad, _per_component(updates, mask)), opt), value

  (new, _), losses = jax.lax.scan(step, (adapter, tx.init(adapter)), batch_idx)
  return new, losses


def server_optimizer(cfg: Config) -> optax.GradientTransformation:
  return optax.sgd(cfg.server_lr) if cfg.server_opt == "sgd" else optax.adam(cfg.server_lr)


def init(cfg: Config, base_params, key, server_tx: optax.GradientTransformation | None = None) -> State:
  """The server's state: a fresh global LoRA (A kaiming-uniform, B zeros), its optimizer state and (flora) the
  merged updates, zero."""
  adapter = lora.init(cfg.lora(), base_params, key)
  tx = server_tx or server_optimizer(cfg)
  merged = {} if cfg.method != "flora" else {p: jnp.zeros_like(lora.get_path(base_params, p), jnp.float32)
                                              for p in adapter}
  return State(adapter, tx.init(adapter), jnp.zeros((), jnp.int32), merged)


def effective(cfg: Config, state: State, base_params):
  """The global model's params: the base, plus the merged updates (flora), plus the global LoRA."""
  return lora.merge(lora.add_deltas(base_params, state.merged), state.adapter, cfg.lora())


def mean_update(cfg: Config, adapters_C, plan: Plan) -> dict:
  """path -> D = mean_i s B_i S_i A_i, the clients' mean full update [.., in, out] (one contraction over the
  stacked factors: the stacking aggregation)."""
  s, c = cfg.lora().scale, plan.mask.shape[0]
  return {p: jnp.einsum("c...ir,c...ro->...io", sk["lora_a"].astype(jnp.float32), sk["lora_b"].astype(jnp.float32))
          * (s / c) for p, sk in jax.vmap(sketched)(adapters_C, plan.mask, plan.factor).items()}


def svd_adapter(cfg: Config, update: dict, like: dict) -> dict:
  """The global LoRA whose update is the rank-r SVD truncation of `update` (lora_a = U_r, lora_b = S_r V_r^T / s)."""
  r, s = cfg.rank, cfg.lora().scale
  out = {}
  for p, d in update.items():
    u, sv, vt = jnp.linalg.svd(d, full_matrices=False)
    out[p] = {"lora_a": u[..., :r].astype(like[p]["lora_a"].dtype),
              "lora_b": (sv[..., :r, None] * vt[..., :r, :] / s).astype(like[p]["lora_b"].dtype)}
  return out


def make_round(cfg: Config, loss_fn: Callable, server_tx: optax.GradientTransformation | None = None):
  """A jitted round(state, base_params, data, plan) -> (state, {"loss": [C, H]}).

  `data` is a pytree of [N, n_max, ...] arrays (see `stack_clients`); the sampled clients run under jax.vmap.
  """
  tx = server_tx or server_optimizer(cfg)

  @jax.jit
  def round_fn(state: State, base_params, data, plan: Plan):
    lr = cfg.round_lr(state.round)
    base = lora.add_deltas(base_params, state.merged)
    start = lora.init(cfg.lora(), base_params, plan.init_key) if cfg.method == "flora" else state.adapter

    def one(cid, mask, factor, idx):
      mine = jax.tree.map(lambda x: x[cid], data)
      own = start
      if cfg.method == "flexlora":  # the global update's rank-k_i part at this client's scale
        own = {p: {**l, "lora_b": l["lora_b"] / factor.astype(l["lora_b"].dtype)} for p, l in start.items()}
      new, losses = client_update(cfg, loss_fn, own, base, mine, mask, factor, idx, lr)
      return (new if cfg.method in ("flexlora", "flora") else jax.tree.map(jnp.subtract, new, start)), losses

    deltas, losses = jax.vmap(one)(plan.clients, plan.mask, plan.factor, plan.batch_idx)
    if cfg.method == "flexlora":
      adapter = svd_adapter(cfg, mean_update(cfg, deltas, plan), state.adapter)
      return State(adapter, state.opt_state, state.round + 1, state.merged), {"loss": losses}
    if cfg.method == "flora":
      update = mean_update(cfg, deltas, plan)
      merged = {p: m + update[p] for p, m in state.merged.items()}
      return State(state.adapter, state.opt_state, state.round + 1, merged), {"loss": losses}
    if cfg.reweight:
      pseudo_grad = _mean_over_covering_clients(deltas, plan.mask)
    else:
      pseudo_grad = jax.tree.map(lambda d: -jnp.mean(d, axis=0), deltas)
    updates, opt_state = tx.update(pseudo_grad, state.opt_state, state.adapter)
    adapter = optax.apply_updates(state.adapter, updates)
    return State(adapter, opt_state, state.round + 1), {"loss": losses}

  return round_fn


def _mean_over_covering_clients(deltas, mask_Cr):
  """-(sum of the deltas) / (number of clients holding the component), per rank component (0 where none did)."""
  inv_r = 1.0 / jnp.maximum(mask_Cr.sum(0), 1.0)
  return _per_component(jax.tree.map(lambda d: -d.sum(0), deltas), inv_r)


def upload_bytes(adapter, plan: Plan) -> np.ndarray:
  """[C] bytes each sampled client uploads: its columns of B and rows of A for every target."""
  per_component = 0
  for leaf in adapter.values():
    a, b = leaf["lora_a"], leaf["lora_b"]
    per_component += a.size // a.shape[-1] * a.dtype.itemsize + b.size // b.shape[-2] * b.dtype.itemsize
  return np.asarray(plan.mask).sum(-1).round().astype(np.int64) * per_component


# --------------------------------------------------------------------------------------------- data

def dirichlet_split(labels, n_clients: int, alpha: float, seed: int = 0, min_size: int = 1,
                    max_tries: int = 1000) -> list[np.ndarray]:
  """Non-IID partition: for each class, client shares ~ Dirichlet(alpha); redrawn until every client has
  `min_size` examples. Clients already holding more than an equal share get no more of later classes
  (the usual balancing, so small alphas terminate).

  Args:
    labels: [n] class (or task) label of every example.
    n_clients: N.
    alpha: concentration (small: each client sees few classes).
    seed: NumPy seed.
    min_size: minimum examples per client.
    max_tries: redraws before giving up.
  """
  labels = np.asarray(labels)
  n = labels.shape[0]
  if n < n_clients * min_size:
    raise ValueError(f"dirichlet_split: {n} examples cannot give {n_clients} clients {min_size} each")
  rng = np.random.default_rng(seed)
  for _ in range(max_tries):
    parts: list[list[int]] = [[] for _ in range(n_clients)]
    for c in np.unique(labels):
      idx = rng.permutation(np.flatnonzero(labels == c))
      p = rng.dirichlet(np.full(n_clients, alpha))
      p = p * np.asarray([len(q) < n / n_clients for q in parts])
      p = p / p.sum() if p.sum() > 0 else np.full(n_clients, 1.0 / n_clients)
      cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
      for q, chunk in zip(parts, np.split(idx, cuts)):
        q.extend(chunk.tolist())
    if min(len(q) for q in parts) >= min_size:
      return [np.sort(np.asarray(q, np.int64)) for q in parts]
  raise ValueError(f"dirichlet_split: no draw in {max_tries} gave every client >= {min_size} examples "
                   f"(alpha={alpha}, {n} examples, {n_clients} clients)")


def task_fill_split(labels, n_clients: int, alpha: float, seed: int = 42) -> list[np.ndarray]:
  """The FSLoRA reference's non-IID split over tasks (`src/utils_data.py:build_datasets`): each task's examples are
  shuffled (NumPy's global-seed stream, in task order); every task but the largest is cut among the clients in
  Dirichlet(alpha) shares (floored, the last client taking the rest), in one contiguous slice per client; then the
  clients, smallest first, are filled from the largest task up to an equal share (total // n_clients) while it lasts
  (the rest of it is unused). Returns each client's example indices, sorted.

  Args:
    labels: [n] task index of every example.
    n_clients: N.
    alpha: concentration (the reference trains with 0.1).
    seed: the NumPy seed (the reference's 42).
  """
  labels = np.asarray(labels)
  rng = np.random.RandomState(seed)
  tasks = [np.flatnonzero(labels == t) for t in np.unique(labels)]
  tasks = [t[rng.permutation(len(t))] for t in tasks]
  largest = max(range(len(tasks)), key=lambda i: len(tasks[i]))
  parts: list[list[int]] = [[] for _ in range(n_clients)]
  for i, idx in enumerate(tasks):
    if i == largest:
      continue
    sizes = [int(p * len(idx)) for p in rng.dirichlet(np.full(n_clients, alpha))]
    sizes[-1] = len(idx) - sum(sizes[:-1])
    for q, cut in zip(parts, np.split(idx, np.cumsum(sizes)[:-1])):
      q.extend(cut.tolist())
  share, fill, at = len(labels) // n_clients, tasks[largest], 0
  for c in sorted(range(n_clients), key=lambda c: len(parts[c])):
    take = min(max(share - len(parts[c]), 0), len(fill) - at)
    parts[c].extend(fill[at:at + take].tolist())
    at += take
  return [np.sort(np.asarray(q, np.int64)) for q in parts]


def stack_clients(data, splits: list[np.ndarray]):
  """(pytree of [N, n_max, ...] arrays, [N] sizes) from a pytree of [n, ...] arrays and per-client indices.

  Short clients are padded with their own first example (never sampled: batch indices stay below the size).
  """
  sizes = np.asarray([len(s) for s in splits], np.int32)
  if sizes.min() < 1:
    raise ValueError(f"stack_clients: every client needs at least one example, found sizes {sizes.tolist()}")
  n_max = int(sizes.max())
  rows = np.stack([np.concatenate([s, np.full(n_max - len(s), s[0])]) for s in splits])
  return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)[rows]), data), sizes


# ------------------------------------------------------------------------------------------ driver

def simulate(cfg: Config, loss_fn: Callable, base_params, data, sizes, rounds: int, key,
             eval_fn: Callable | None = None, eval_every: int = 0,
             server_tx: optax.GradientTransformation | None = None, state: State | None = None):
  """Runs `rounds` rounds; returns (state, history).

  Args:
    cfg, loss_fn: as in `make_round`.
    base_params: frozen base params.
    data, sizes: from `stack_clients`.
    rounds: number of rounds.
    key: PRNG key (adapter init and every round's plan).
    eval_fn: eval_fn(effective_params) -> dict of floats, run every `eval_every` rounds and at the end.
    server_tx: server optimizer (default from cfg).
    state: resume from this server state.

  Each history entry: round, train_loss (mean client loss at the last local step), upload_bytes (cumulative,
  all clients), and the eval metrics where computed.
  """
  k_init, key = jax.random.split(key)
  if state is None:
    state = init(cfg, base_params, k_init, server_tx)
  round_fn = make_round(cfg, loss_fn, server_tx)
  history, total = [], 0
  for i in range(rounds):
    plan = plan_round(cfg, jax.random.fold_in(key, int(state.round)), sizes)
    total += int(upload_bytes(state.adapter, plan).sum())
    state, m = round_fn(state, base_params, data, plan)
    entry = {"round": int(state.round), "train_loss": float(jnp.mean(m["loss"][:, -1])), "upload_bytes": total}
    if eval_fn is not None and ((eval_every and (i + 1) % eval_every == 0) or i == rounds - 1):
      entry.update({k: float(v) for k, v in eval_fn(effective(cfg, state, base_params)).items()})
    history.append(entry)
  return state, history
