"""The run of polar: what `python -m experiments run polar` executes (its Config, presets and claims are in
`experiments/polar/__init__.py`, the paper and its departures in `experiments/polar/README.md`)."""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments import registry
from experiments._shared.chat_models import abstract_params, chat_ids, load_chat_model, model_config, place
from experiments.runner import plan as plan_lib
from experiments.runner import splits
from jaxlab import hf
from jaxlab import sharding as shd
from jaxlab.data.tasks import arithmetic, reasoning
from jaxlab.models import encoder
from jaxlab.models import program_predictor as pp
from jaxlab.models import programs
from jaxlab.models import registry as real_models
from jaxlab.models import transformer as tfm
from jaxlab.nn import layers
from jaxlab.train import state as state_lib, step as step_lib
from experiments.polar import Config


def _load_task(spec: str, n: int, seed: int, drawn: dict | None = None) -> list[tuple[str, str, tuple | None]]:
  """n (question, answer, choices or None) rows of task `spec`, none of whose questions (`splits.canonical`) is in
  `drawn["seen"]`.

  A generated task draws with `seed` and passes over questions already drawn (answers stay balanced); a JSONL task
  reads its records in file order from `drawn["next"][spec]` on (the record after those of earlier draws), passing
  over repeated questions. `drawn` ({"seen": set of questions, "next": {spec: record}}) is updated, so successive
  draws (training, held-out, OOD) are disjoint.
  """
  drawn = {"seen": set(), "next": {}} if drawn is None else drawn
  seen = drawn["seen"]
  if spec in reasoning.TASKS:
    answers = reasoning.TASKS[spec].answers
    want = [len(range(i, n, len(answers))) for i in range(len(answers))]
    m = n
    while True:  # `generate(2m)` extends `generate(m)` (one generator, same seed)
      queues = {a: {} for a in answers}
      for ex in reasoning.generate(spec, m, seed=seed):
        if splits.canonical(ex.prompt) not in seen:
          queues[ex.answer].setdefault(splits.canonical(ex.prompt), ex)
      if all(len(queues[a]) >= w for a, w in zip(answers, want)):
        break
      if m >= 64 * n + 64:
        raise ValueError(f"task {spec}: fewer than {n} questions not drawn before among {m} generated; ask for fewer")
      m *= 2
    queues = {a: list(q.values()) for a, q in queues.items()}
    rows = [queues[answers[i % len(answers)]][i // len(answers)] for i in range(n)]
    seen.update(splits.canonical(ex.prompt) for ex in rows)
    return [(ex.prompt, ex.answer, answers) for ex in rows]
  _, fmt, path = spec.split(":", 2)
  nxt, out = drawn["next"].get(spec, 0), []
  while len(out) < n:
    chunk = arithmetic.load_jsonl(path, fmt, limit=max(n - len(out), 64), offset=nxt)
    if not chunk:
      raise ValueError(f"task {spec}: {len(out)} of {n} questions left after record {nxt} (earlier draws took the "
                       f"first records); ask for fewer")
    for ex in chunk:
      nxt += 1
      if splits.canonical(ex.prompt) not in seen:
        seen.add(splits.canonical(ex.prompt))
        out.append((ex.prompt, ex.answer, None))
        if len(out) == n:
          break
  drawn["next"][spec] = nxt
  return out


def questions(cfg: Config, tok, tasks, n: int, seed: int, drawn: dict | None = None) -> list[dict]:
  """Answer-only prompts with the answer's first token and the choices' first tokens (`_load_task`: none of their
  questions in `drawn`, which is updated)."""
  rows = []
  for k, task in enumerate(tasks):
    for q, a, choices in _load_task(task, n // len(tasks) + (k < n % len(tasks)), seed + 1000 * k, drawn):
      ask = f" Answer with one word: {' or '.join(choices)}." if choices else " Answer with the final answer only."
      ids = chat_ids(tok, q + ask) if tok.chat_template else tok.encode(f"Question: {q}{ask}\nAnswer:")
      choice_ids = None
      if choices and cfg.scoring == "choices":
        choice_ids = [tok.encode(c)[0] for c in choices]
        if len(set(choice_ids)) != len(choice_ids):
          raise ValueError(f"task {task}: answers {choices} share a first token; use scoring='vocab'")
      rows.append({"task": task, "question": q, "ids": ids, "answer": tok.encode(a)[0], "choices": choice_ids})
  return rows


def question_splits(cfg: Config, tok) -> tuple[list[dict], list[dict], list[dict]]:
  """Training, held-out and OOD questions, disjoint: held-out JSONL questions are the records after the training
  ones (as the reference evaluates on later records), generated ones skip questions drawn for training."""
  drawn = {"seen": set(), "next": {}}
  train = questions(cfg, tok, cfg.tasks, cfg.train_questions, cfg.seed, drawn)
  test = questions(cfg, tok, cfg.tasks, cfg.test_questions, cfg.seed + 1, drawn)
  ood = questions(cfg, tok, (cfg.ood_task,), cfg.ood_questions, cfg.seed + 2, drawn) if cfg.ood_questions else []
  return train, test, ood


def scorer_fn(mcfg):
  """The jitted scoring pass: (params, tokens [1, T], mask [1, T], last position, programs [N, P]) -> float32
  logits [N, V] at the last prompt position under each program."""
  def fn(params, tokens_1T, mask_1T, last, programs_NP):
    # only the last position's logits: the residual stream there, then the final norm and the LM head
    res = programs.forward_batch(params, tokens_1T, mcfg, programs_NP, attention_mask_BT=mask_1T).residual
    h_N1D = layers.rms_norm(params["final_norm"], res[:, 0, last][:, None], mcfg.norm_eps)
    dt = jnp.dtype(mcfg.dtype)
    head = layers.linear(params["lm_head"], h_N1D, dt) if "lm_head" in params else \
        layers.unembed(params["embed"], h_N1D, dt)
    return head[:, 0].astype(jnp.float32)  # [N, V]
  return jax.jit(fn)


class Scorer:
  """Margins of batches of programs on one question, one compile per (prompt bucket, padded length); with `mesh`,
  a batch's programs are split over its batch axes (`shard_rows`)."""

  def __init__(self, params, mcfg, batch: int, mesh=None):
    self.params, self.mcfg, self.batch, self.calls, self.mesh = params, mcfg, batch, 0, mesh
    self._fn = scorer_fn(mcfg)

  def __call__(self, row: dict, progs) -> np.ndarray:
    ids = row["ids"]
    t = -(-len(ids) // 16) * 16
    tok = np.zeros((1, t), np.int32)
    mask = np.zeros((1, t), np.int32)
    tok[0, :len(ids)], mask[0, :len(ids)] = ids, 1
    progs = [list(p) for p in progs]
    longest = max((len(p) for p in progs), default=0)
    if longest > 2 * self.mcfg.n_layers:
      raise ValueError(f"a program may run at most 2 * {self.mcfg.n_layers} layers (every pack twice), found "
                       f"{longest}")
    out = []
    for s in range(0, len(progs), self.batch):
      part = progs[s:s + self.batch]
      n = min(max(4, 1 << (len(part) - 1).bit_length()), self.batch)  # a power of two: few compiled shapes
      p = -(-max(max(len(x) for x in part), 1) // 8) * 8
      padded = programs.pad(part + [[]] * (n - len(part)), p, self.mcfg.n_layers)
      logits = np.asarray(self._fn(self.params, tok, mask, len(ids) - 1, shd.shard_rows(padded, self.mesh)))[:len(part)]
      self.calls += 1
      out.append(margins(logits, row["answer"], row["choices"]))
    return np.concatenate(out)


def margins(logits_NV: np.ndarray, answer: int, choices) -> np.ndarray:
  """The answer's logit minus the best other candidate's (choices, or the whole vocabulary); > 0 is right."""
  cand = np.asarray(choices) if choices is not None else np.arange(logits_NV.shape[-1])
  other = np.where(cand == answer, -np.inf, logits_NV[:, cand]).max(-1)
  return logits_NV[:, answer] - other


def edits(n_layers: int, sizes, stride: int) -> list[programs.Segment]:
  return [programs.Segment(s, z, op) for s in range(0, n_layers, stride) for z in sizes if s + z <= n_layers
          for op in (programs.SKIP, programs.REPEAT)]


def apply_edits(chosen, n_layers: int) -> tuple[int, ...]:
  """The full program with each chosen (non-overlapping) segment skipped or run twice."""
  out, cursor = [], 0
  for e in sorted(chosen):
    out += list(range(cursor, e.start))
    out += list(range(e.start, e.start + e.size)) * (0 if e.op == programs.SKIP else 2)
    cursor = e.start + e.size
  return tuple(out + list(range(cursor, n_layers)))


def beam_search(score_fn, n_layers: int, candidates, *, beam: int, depth: int, sample: int = 0,
                rng: np.random.Generator | None = None) -> dict[tuple[int, ...], float]:
  """Every program the beam evaluated -> its margin (the full program included).

  Args:
    score_fn: list of programs -> margins [N].
    candidates: the edit segments (SKIP / REPEAT) a step may add.
    sample: programs evaluated per step at most, drawn at random among the new ones (0: all).
  """
  full = tuple(range(n_layers))
  seen: dict[tuple[int, ...], float] = {}
  frontier = [()]
  for step in range(depth):
    new = {}
    for chosen in frontier:
      for e in candidates:
        if any(e.start < c.start + c.size and c.start < e.start + e.size for c in chosen):
          continue
        prog = apply_edits(chosen + (e,), n_layers)
        if prog not in seen and prog not in new:
          new[prog] = chosen + (e,)
    progs = list(new)
    if sample and len(progs) > sample:
      progs = [progs[i] for i in sorted((rng or np.random.default_rng(0)).choice(len(progs), sample, False))]
    if not progs and step:
      break
    scores = np.asarray(score_fn(progs if step else [full] + progs), np.float64)
    if not step:
      seen[full], scores = float(scores[0]), scores[1:]
    seen.update((p, float(s)) for p, s in zip(progs, scores))
    if not progs:
      break
    order = sorted(range(len(progs)), key=lambda i: (-scores[i], len(progs[i])))
    frontier = [new[progs[i]] for i in order[:beam]]
  return seen


def training_rows(found: dict, n_layers: int, cfg: Config):
  """(program, weight) targets of one question: its right programs, shortest (then largest margin) first."""
  right = sorted((p for p, m in found.items() if m > 0), key=lambda p: (len(p), -found[p]))[:cfg.max_paths]
  shorter = any(len(p) < n_layers for p in right)
  out = []
  for p in right:
    w = float(np.exp(-cfg.length_beta * len(p)))
    if p == tuple(range(n_layers)) and shorter:
      w *= cfg.full_weight
    out.append((p, w))
  return out


def embed_questions(params, ecfg, etok, texts, t_max: int = 128):
  """MiniLM last hidden states of `[CLS] text [SEP]` [N, T, E] and the mask [N, T]."""
  rows = [[etok.bos_id, *etok.encode(t)[:t_max - 2], etok.eos_id] for t in texts]
  t = -(-max(len(r) for r in rows) // 16) * 16
  ids, mask = np.zeros((len(rows), t), np.int32), np.zeros((len(rows), t), np.int32)
  for i, r in enumerate(rows):
    ids[i, :len(r)], mask[i, :len(r)] = r, 1
  fn = jax.jit(lambda p, i, m: encoder.forward(p, i, ecfg, mask_BT=m).last_hidden_state)
  h = np.concatenate([np.asarray(fn(params, ids[s:s + 32], mask[s:s + 32])) for s in range(0, len(rows), 32)])
  return h, mask


def predictor_step(pcfg: pp.Config, cfg: Config):
  """(jitted AdamW step on the predictor's weighted loss, the optimizer)."""
  tx = optax.adamw(cfg.learning_rate)

  def loss_fn(params, batch, rng):  # already a (weighted) mean: weight 1
    del rng
    value = pp.loss(params, batch["feats"], batch["mask"], batch["boundary"], batch["ops"], batch["weights"], pcfg)
    return value, 1.0, {}
  return step_lib.jit_train_step(step_lib.make_train_step(loss_fn, tx)), tx


def train_predictor(pcfg: pp.Config, feats, mask, boundary, ops, weights, cfg: Config):
  """AdamW on the weighted loss; returns (params, per-epoch mean losses)."""
  step, tx = predictor_step(pcfg, cfg)
  state = state_lib.create(jax.jit(pp.init, static_argnums=0)(pcfg, jax.random.key(cfg.seed)), tx)

  rng, n, losses = np.random.default_rng(cfg.seed), len(feats), []
  bs = min(cfg.batch_size, n)
  for _ in range(cfg.epochs):
    perm, total = rng.permutation(n), []
    for s in range(0, n - bs + 1, bs):
      i = perm[s:s + bs]
      state, m = step(state, {"feats": feats[i], "mask": mask[i], "boundary": boundary[i], "ops": ops[i],
                              "weights": weights[i]})
      total.append(float(m["loss"]))
    losses.append(float(np.mean(total)))
  return state.params, losses


def top_programs(params, pcfg: pp.Config, feats, mask, cfg: Config) -> list[list[list[int]]]:
  out = jax.jit(pp.forward, static_argnums=2)(params, jnp.asarray(feats), pcfg, jnp.asarray(mask))
  seg, op = np.asarray(out.seg_logits_BL), np.asarray(out.op_logits_BLO)
  return [[programs.decode(s, pcfg.n_layers) for s, _ in
           pp.beam_decode(seg[i], op[i], max_pack=cfg.max_pack, beam=cfg.top_k, top_ops=cfg.top_ops)]
          for i in range(len(seg))]


def evaluate(scorer: Scorer, rows, tops, n_layers: int, prefix: str = "", baselines=None) -> dict:
  """Full forward, top-1 and pass@k of the predicted programs; with `baselines` (k programs per row), their
  pass@k too (the full program plus k-1 random single edits: what pass@k gets without a predictor). Without a
  `prefix` (the held-out questions) also `per_item`: each figure's 0/1 per question, for the claims' intervals."""
  full, top1, pass_k, lengths, fallback, base = [], [], [], [], [], []
  for i, (row, progs) in enumerate(zip(rows, tops)):
    extra = [] if baselines is None else baselines[i]
    uniq = list(dict.fromkeys(tuple(p) for p in [range(n_layers), *progs, *extra]))
    right = dict(zip(uniq, scorer(row, uniq) > 0))
    base.append(any(right[tuple(p)] for p in extra))
    full.append(right[tuple(range(n_layers))])
    top1.append(right[tuple(progs[0])])
    pass_k.append(any(right[tuple(p)] for p in progs))
    lengths.append(len(progs[0]))
    fallback.append(progs[0] == list(range(n_layers)))
  return {f"{prefix}acc.full_forward": float(np.mean(full)), f"{prefix}acc.predictor_top1": float(np.mean(top1)),
          f"{prefix}pass5.predictor": float(np.mean(pass_k)), f"{prefix}layers.full": float(n_layers),
          f"{prefix}layers.predictor_top1": float(np.mean(lengths)),
          f"{prefix}top1_is_full_rate": float(np.mean(fallback)),
          **({f"{prefix}pass5.full_plus_random_edits": float(np.mean(base))} if baselines is not None else {}),
          **({} if prefix else {"per_item": {
              "acc.full_forward": full, "acc.predictor_top1": top1, "pass5.predictor": pass_k,
              **({"pass5.full_plus_random_edits": base} if baselines is not None else {})}})}


def random_edit_programs(n_rows: int, k: int, n_layers: int, cands, rng) -> list[list[tuple[int, ...]]]:
  """Per row: the full program and k-1 programs of one random edit each."""
  return [[tuple(range(n_layers))] + [apply_edits((cands[j],), n_layers) for j in
                                      rng.choice(len(cands), min(k - 1, len(cands)), replace=False)]
          for _ in range(n_rows)]


def run_with_models(cfg: Config, out_dir: str, mcfg, params, tok, ecfg, eparams, etok, mesh=None) -> dict:
  n_layers = mcfg.n_layers
  train, test, ood = question_splits(cfg, tok)
  splits.record(out_dir, "polar", {"train": {"questions": [r["question"] for r in train]},
                                   "test": {"questions": [r["question"] for r in test]},
                                   **({"ood": {"questions": [r["question"] for r in ood]}} if ood else {})})
  scorer = Scorer(params, mcfg, cfg.program_batch, mesh)
  cands = edits(n_layers, cfg.edit_sizes, cfg.stride)
  rng = np.random.default_rng(cfg.seed)
  targets, shorter, wrong_full, corrected, records = [], [], 0, 0, []
  for qi, row in enumerate(train):
    found = beam_search(lambda ps, row=row: scorer(row, ps), n_layers, cands, beam=cfg.beam, depth=cfg.depth,
                        sample=cfg.candidates, rng=rng)
    full_right = found[tuple(range(n_layers))] > 0
    any_right = any(m > 0 for m in found.values())
    shorter.append(any(m > 0 and len(p) < n_layers for p, m in found.items()))
    wrong_full += not full_right
    corrected += (not full_right) and any_right
    for p, w in training_rows(found, n_layers, cfg):
      targets.append((qi, p, w))
    records.append({"question": qi, "programs": len(found), "full_right": bool(full_right),
                    "right": int(sum(m > 0 for m in found.values())), "shortest_right": min(
                        (len(p) for p, m in found.items() if m > 0), default=None)})
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  res = {"search.shorter_correct_rate": float(np.mean(shorter)),
         "search.corrected_rate": float(corrected / wrong_full) if wrong_full else float("nan"),
         "search.programs_per_question": float(np.mean([r["programs"] for r in records])),
         "train.examples": len(targets)}

  pcfg = pp.Config(n_layers=n_layers, d_in=ecfg.d_model, d_model=cfg.d_model, n_heads=cfg.n_heads,
                   n_blocks=cfg.n_blocks)
  feats, mask = embed_questions(eparams, ecfg, etok, [r["question"] for r in train + test + ood])
  f_train, f_test, f_ood = np.split(feats, [len(train), len(train) + len(test)])
  m_train, m_test, m_ood = np.split(mask, [len(train), len(train) + len(test)])
  if targets:
    lab = [programs.labels(programs.encode(p, n_layers, cfg.max_pack), n_layers) for _, p, _ in targets]
    qi = np.array([t[0] for t in targets])
    pparams, losses = train_predictor(pcfg, f_train[qi], m_train[qi], np.stack([b for b, _ in lab]),
                                      np.stack([o for _, o in lab]), np.array([t[2] for t in targets], np.float32),
                                      cfg)
    res["predictor.loss_first"], res["predictor.loss_last"] = losses[0], losses[-1]
  else:  # no right program anywhere: an untrained predictor, reported as such
    pparams, res["predictor.loss_first"], res["predictor.loss_last"] = jax.jit(pp.init, static_argnums=0)(
        pcfg, jax.random.key(cfg.seed)), \
        float("nan"), float("nan")
  base = (lambda n: random_edit_programs(n, cfg.top_k, n_layers, cands, rng)) if cfg.random_baseline else \
      (lambda n: None)
  res.update(evaluate(scorer, test, top_programs(pparams, pcfg, f_test, m_test, cfg), n_layers,
                      baselines=base(len(test))))
  if ood:
    res.update(evaluate(scorer, ood, top_programs(pparams, pcfg, f_ood, m_ood, cfg), n_layers, "ood.",
                        baselines=base(len(ood))))
  res["lm_calls"] = scorer.calls
  registry.plot_curves(os.path.join(out_dir, "accuracy.png"),
                       {"held-out": ([0, 1, 2], [res["acc.full_forward"], res["acc.predictor_top1"],
                                                 res["pass5.predictor"]])},
                       title="polar: full forward (0), predictor top-1 (1), pass@5 (2)", xlabel="method",
                       ylabel="accuracy")
  return res


def load_embedder(spec: str):
  path = real_models.real_model_path(spec) if spec in real_models.REAL_MODELS else spec
  ecfg, eparams = hf.load(path)
  if not isinstance(ecfg, encoder.Config):
    raise ValueError(f"embedder {spec!r} must be a BERT-family encoder directory, found a {type(ecfg).__name__}")
  return ecfg, eparams, encoder.load_tokenizer(path)


def load_lm(spec: str, dtype: str = "float32"):
  """(cfg, params, tokenizer): a chat model (params and compute in `dtype`), or "tiny-random:N" (a random N-layer
  transformer over MiniLM's tokenizer, prompted without a chat template, for the smoke preset)."""
  if not spec.startswith("tiny-random"):
    return load_chat_model(spec, dtype, compute=dtype)
  n = int(spec.split(":")[1]) if ":" in spec else 4
  tok = encoder.load_tokenizer(real_models.real_model_path("minilm-l6"))
  mcfg = tfm.Config.tiny(vocab_size=tok.vocab_size, n_layers=n)
  return mcfg, jax.jit(tfm.init, static_argnums=0)(mcfg, jax.random.key(0)), tok


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # search and training take minutes; a rerun redoes them
  mcfg, params, tok = load_lm(cfg.model, cfg.dtype)
  mesh = shd.make_mesh(cfg.mesh) if cfg.mesh else None
  return run_with_models(cfg, out_dir, mcfg, place(params, mesh, cfg.strategy), tok, *load_embedder(cfg.embedder),
                         mesh)


# ------------------------------------------------------------------------------------------------ plan

# What the plan cannot read before the run: a question's answer-only prompt in the chat format (the run buckets
# prompts to 16 tokens; the generated tasks' questions take 60-95 tokens before the chat template's).
PLAN_QUESTION_TOKENS = 128
EMBED_TOKENS = 128  # `embed_questions`' t_max: the predictor's question states are at most this long


def scoring_calls(cfg: Config, n_layers: int) -> int:
  """An upper bound on the scorer's batches in a run: per training question the beam's first step (the full
  program and every candidate edit) and each later step (beam x candidates new programs at most), `candidates`
  sampled when set, in batches of program_batch; per held-out and OOD question one batch of the full program, the
  top_k predicted ones and (random_baseline) top_k - 1 random edits."""
  c = len(edits(n_layers, cfg.edit_sizes, cfg.stride))
  first = c if not cfg.candidates else min(c, cfg.candidates)
  later = cfg.beam * c if not cfg.candidates else min(cfg.beam * c, cfg.candidates)
  per_question = -(-(1 + first) // cfg.program_batch) + (cfg.depth - 1) * -(-later // cfg.program_batch)
  held = 1 + cfg.top_k + (cfg.top_k - 1 if cfg.random_baseline else 0)
  return cfg.train_questions * per_question + (cfg.test_questions + cfg.ood_questions) * -(-held //
                                                                                          cfg.program_batch)


def predictor_flops(pcfg: pp.Config, t: int) -> float:
  """Forward FLOPs of the predictor on one question of `t` token states: the input projection, the layer queries'
  cross-attention, n_blocks encoder layers over the L layer slots (attention and a 4 d ReLU MLP) and the heads."""
  d, e, n = pcfg.d_model, pcfg.d_in, pcfg.n_layers
  cross = 2 * e * d * t + 2 * d * d * (2 * n + 2 * t) + 4 * n * t * d
  return cross + pcfg.n_blocks * (24 * d * d * n + 4 * n * n * d) + 2 * d * (1 + pp.N_OPS) * n


def workloads(cfg: Config, mesh) -> list[plan_lib.Workload]:
  """What a run computes at `cfg`, for `experiments plan`: the scorer (`scorer_fn`: program_batch programs of at
  most n_layers + depth x max(edit_sizes) layers on a PLAN_QUESTION_TOKENS prompt, `scoring_calls` times; the LM's
  params abstract, sharded by cfg.strategy over `mesh`, the programs' rows as `shard_rows` places them) and the
  predictor's AdamW step (`predictor_step`, batch_size questions of EMBED_TOKENS MiniLM states, epochs over at
  most max_paths programs per training question). The frozen embedder's passes (MiniLM over the questions, one
  batch of 32 per 32 questions) are left out: a few GFLOPs in all."""
  mcfg = model_config(cfg.model, cfg.dtype, cfg.dtype)
  params = abstract_params(mcfg, mesh, cfg.strategy)
  n, t, b = mcfg.n_layers, PLAN_QUESTION_TOKENS, cfg.program_batch
  p = min(2 * n, -(-(n + cfg.depth * max(cfg.edit_sizes)) // 8) * 8)
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  tokens = jax.ShapeDtypeStruct((1, t), np.int32, sharding=rep)
  last = jax.ShapeDtypeStruct((), np.int32, sharding=rep)
  progs = shd.abstract_rows({"programs": ((b, p), np.int32)}, mesh)["programs"]
  per_layer = (tfm.flops_per_token(mcfg, t) / 3 - 2 * mcfg.d_model * mcfg.vocab_size) / n  # one layer, one token
  score_flops = b * (t * p * per_layer + 2 * mcfg.d_model * mcfg.vocab_size)
  pcfg = pp.Config(n_layers=n, d_in=embedder_width(cfg.embedder), d_model=cfg.d_model, n_heads=cfg.n_heads,
                   n_blocks=cfg.n_blocks)
  step, tx = predictor_step(pcfg, cfg)
  state = jax.eval_shape(lambda: state_lib.create(pp.init(pcfg, jax.random.key(0)), tx))
  state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), state)
  bs = min(cfg.batch_size, cfg.train_questions * cfg.max_paths)
  batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=rep) for k, (shape, dtype) in {
      "feats": ((bs, EMBED_TOKENS, pcfg.d_in), np.float32), "mask": ((bs, EMBED_TOKENS), np.int32),
      "boundary": ((bs, n), np.int32), "ops": ((bs, n), np.int32), "weights": ((bs,), np.float32)}.items()}
  return [plan_lib.Workload("score_programs", "forward", scorer_fn(mcfg), (params, tokens, tokens, last, progs),
                            scoring_calls(cfg, n), score_flops),
          plan_lib.Workload("predictor_step", "train", step, (state, batch),
                            cfg.epochs * (cfg.train_questions * cfg.max_paths // bs),
                            3 * bs * predictor_flops(pcfg, EMBED_TOKENS))]


def embedder_width(spec: str) -> int:
  """The frozen embedder's hidden width, from its config.json (no weights read)."""
  from jaxlab.hf import hub
  path = real_models.real_model_path(spec) if spec in real_models.REAL_MODELS else spec
  return int(hub.architecture(path)["hidden_size"])
