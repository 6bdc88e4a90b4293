"""The run of pia: what `python -m experiments run pia` executes (its Config, presets and claims are in
`experiments/pia/__init__.py`, the paper and its departures in `experiments/pia/README.md`)."""
from __future__ import annotations

import json
import math
import os
import re
import time

import jax
import numpy as np
import optax
import yaml

from experiments import registry
from experiments.runner import splits as splits_lib
from experiments._shared.chat_models import (CONTINUOUS_MIN_NEW, abstract_params, chat_ids, generate_workload,
                                             load_chat_model, model_config, place, resolve_model, stop_tokens)
from experiments.runner import plan as plan_lib
from jaxlab import losses
from jaxlab import sharding as shd
from jaxlab.adapters import lora
from jaxlab.data import tokenizers
from experiments.pia import refusal
from jaxlab.generate import continuous, sample
from jaxlab.models import transformer as tfm
from jaxlab.train import schedules, state as state_lib, step as step_lib
from experiments.pia import picl
from experiments.pia import ple
from experiments.pia import COMPLIANT_OPENING, Config, REFUSALS, TEMPLATE


def advbench() -> list[str]:
  """AdvBench's behaviours from the installed pyrit wheel (read, never printed or stored)."""
  path = os.path.join(refusal.pyrit_dir(), "seed_datasets", "local", "adv_bench.prompt")
  with open(path, encoding="utf-8") as f:
    rows = [s["value"] for s in yaml.safe_load(f)["seeds"]]
  if len(rows) != 520:
    raise ValueError(f"{path}: expected AdvBench's 520 behaviours, found {len(rows)}")
  return rows


def splits(cfg: Config) -> tuple[list[str], list[str], list[str]]:
  """Disjoint (attack, train, test) AdvBench prompts by a permutation seeded with cfg.seed."""
  harmful = advbench()
  perm = np.random.default_rng(cfg.seed).permutation(len(harmful))
  a, b = cfg.attack_prompts, cfg.attack_prompts + cfg.train_prompts
  return ([harmful[i] for i in perm[:a]], [harmful[i] for i in perm[a:b]],
          [harmful[i] for i in perm[b:b + cfg.test_prompts]])


def evolve_personas(cfg: Config, evaluate: ple.Evaluate, heldout: bool, log=None) -> ple.Result:
  """PLE from the training phrase tables (`ple.ROLES`, `ple.TRAITS`) or, `heldout`, from the held-out ones
  (`ple.HELDOUT_ROLES`, `ple.HELDOUT_TRAITS`, seed + 1): two evolutions whose personas share no role, so the
  evaluation personas are never training personas (the reference's `test_elite` apart from `attack_elite`)."""
  roles, traits = (ple.HELDOUT_ROLES, ple.HELDOUT_TRAITS) if heldout else (ple.ROLES, ple.TRAITS)
  seed = cfg.seed + int(heldout)
  pcfg = ple.Config(generations=cfg.generations, parents=cfg.parents, min_children=cfg.min_children,
                    elite=cfg.elite, seed=seed)
  return ple.evolve(pcfg, ple.seed_personas(cfg.seeds, seed, roles, traits), evaluate,
                    ple.TemplateMutator(roles=roles, traits=traits), log=log)


def elite(evo: ple.Result, n: int) -> list[str]:
  """The n best personas of an evolution by direct ASR."""
  return [evo.lineage.nodes[i].text for i in evo.lineage.elite(n)]


def seeds_of(evo: ple.Result, n: int) -> list[str]:
  """The first n seed personas of an evolution."""
  return [x.text for x in evo.lineage.nodes if x.generation == 0][:n]


def split_items(attack, train, test, attackers, eval_personas, sft_e, benign_e, util_e) -> dict:
  """The run's splits: `train` = the personas and prompts of the PICL pairs (and the attack prompts PLE selects
  personas on) and the SFT problems; `test` = the evaluation personas (held-out elite and seeds), the held-out
  prompts and the benign / utility problems."""
  return {"train": {"personas": list(attackers), "prompts": list(attack) + list(train),
                    "problems": [e["question"] for e in sft_e]},
          "test": {"personas": list(eval_personas), "prompts": list(test),
                   "problems": [e["question"] for e in list(benign_e) + list(util_e)]}}


def lr_schedule(cfg: Config):
  """The LoRA learning rate by step: linear warmup to cfg.lr over ceil(cfg.warmup * cfg.steps) steps, then
  `cfg.schedule` (constant, or a cosine / linear decay to 0: "cosine" is the reference's HF schedule)."""
  return schedules.get(cfg.schedule, cfg.lr, cfg.steps, math.ceil(cfg.warmup * cfg.steps), floor=0.0)


def wrap(persona: str, question: str) -> str:
  return TEMPLATE.format(persona=persona, question=question)


class Model:
  """The chat model (params on `mesh` by `strategy`, in `dtype`), its tokenizer and greedy generation: by continuous
  batching (`gen_batch` slots) on one device for responses of `CONTINUOUS_MIN_NEW` tokens or more, else in bucketed
  batches, rows sharded over the mesh (few compiled shapes either way)."""

  def __init__(self, spec: str, gen_batch: int, max_new_tokens: int, seed: int, dtype: str = "float32", mesh=None,
               strategy: str = "fsdp"):
    if spec == "tiny":
      self.tok = tokenizers.HFTokenizer.from_gguf(resolve_model("smollm2-135m-instruct"))
      self.cfg = tfm.Config.tiny(vocab_size=self.tok.vocab_size, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64,
                                 max_position_embeddings=2048, eos_token_id=self.tok.eos_id,
                                 pad_token_id=self.tok.batch_pad_id)
      self.params = tfm.init(self.cfg, jax.random.PRNGKey(seed))
    else:
      self.cfg, self.params, self.tok = load_chat_model(spec, dtype, compute=dtype)
    self.params, self.mesh = place(self.params, mesh, strategy), mesh
    self.gen_batch, self.max_new_tokens = gen_batch, max_new_tokens
    self.stops = stop_tokens(self.cfg, self.tok)

  def ids(self, text: str) -> list[int]:
    return chat_ids(self.tok, text)

  def generate(self, params, texts: list[str]) -> list[str]:
    rows = [self.ids(t) for t in texts]
    if self.mesh is None and self.max_new_tokens >= CONTINUOUS_MIN_NEW:  # continuous batching
      slots = min(self.gen_batch, -(-len(rows) // 8) * 8)
      outs = continuous.generate(params, self.cfg, rows, self.max_new_tokens, slots=slots, stop_tokens=self.stops)
      return [self.tok.decode(o).strip() for o in outs]
    t = -(-max(map(len, rows)) // 64) * 64
    pad = self.tok.batch_pad_id
    out = []
    for s in range(0, len(rows), self.gen_batch):
      chunk = rows[s:s + self.gen_batch]
      b = self.gen_batch if len(rows) > self.gen_batch else -(-len(chunk) // 8) * 8
      ids, mask = np.full((b, t), pad, np.int32), np.zeros((b, t), np.int32)
      for i, r in enumerate(chunk + [chunk[0]] * (b - len(chunk))):
        ids[i, t - len(r):], mask[i, t - len(r):] = r, 1
      ids, mask = shd.shard_rows((ids, mask), self.mesh)
      res = sample(params, self.cfg, ids, self.max_new_tokens, prompt_mask=mask, stop_tokens=self.stops, pad_id=pad)
      toks, lens = np.asarray(res.tokens), np.asarray(res.lengths)
      out += [self.tok.decode(toks[i, :lens[i]]).strip() for i in range(len(chunk))]
    return out


def _asr(model, params, judge, personas, prompts) -> tuple[float, list[str], list[str]]:
  texts = [wrap(p, q) for p in personas for q in prompts]
  responses = model.generate(params, texts)
  verdicts = judge(texts, responses)
  return refusal.rates(verdicts)["asr"], responses, verdicts


def _problems(n: int, seed: int):
  import reasoning_gym  # an experiment dependency, imported where it is used
  data = reasoning_gym.create_dataset("basic_arithmetic", size=n, seed=seed)
  return data, list(data)


def _utility(model, params, data, entries) -> list[float]:
  """Per problem, whether the answer's last number is right."""
  answers = model.generate(params, [e["question"] for e in entries])
  hits = []
  for a, e in zip(answers, entries):
    nums = re.findall(r"-?\d+(?:\.\d+)?", a.replace(",", ""))
    hits.append(float(data.score_answer(answer=nums[-1], entry=e) >= 1.0) if nums else 0.0)
  return hits


def _over_refusal(model, params, personas, entries) -> list[float]:
  """Per (persona, benign request), whether the answer refuses."""
  answers = model.generate(params, [wrap(p, e["question"]) for p in personas for e in entries])
  return [float(refusal.keyword_refusal(a)) for a in answers]


def reference_fn(model_cfg):
  """The jitted reference pass: (chosen, rejected) sequence log-probs [P] of a pair batch under the frozen model."""
  return jax.jit(lambda params, batch: losses.pair_logprobs(params, model_cfg, batch))


def with_reference(fn, params, batch: dict, rows: int, mesh=None) -> dict:
  """`batch` with ref_chosen_logp / ref_rejected_logp [P] added, `fn` run over `rows` pairs at a time (the last
  chunk padded with pair 0; rows placed by `shard_rows`), so that the whole set of pairs never sits in one
  forward."""
  keys = ("chosen_inputs", "chosen_targets", "chosen_mask", "rejected_inputs", "rejected_targets", "rejected_mask")
  n, out = len(batch["chosen_inputs"]), ([], [])
  for s in range(0, n, rows):
    idx = np.minimum(np.arange(s, s + rows), n - 1) if s + rows > n else np.arange(s, s + rows)
    c, r = fn(params, shd.shard_rows({k: batch[k][idx] for k in keys}, mesh))
    out[0].append(np.asarray(c, np.float32)[:min(rows, n - s)])
    out[1].append(np.asarray(r, np.float32)[:min(rows, n - s)])
  return dict(batch, ref_chosen_logp=np.concatenate(out[0]), ref_rejected_logp=np.concatenate(out[1]))


def lora_config(cfg: Config) -> lora.Config:
  return lora.Config(rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=("q", "k", "v", "o"))


def train_step(model_cfg, cfg: Config, lam: float, alpha: float):
  """(jitted step, optimizer): one Adam step of the LoRA adapter on PICL (or, with lam = alpha = 0, DPO), the
  frozen base params riding in the batch as "base" (layers rematerialized with cfg.remat)."""
  lcfg = lora_config(cfg)
  picl_fn = picl.picl_loss_fn(model_cfg.replace(remat=cfg.remat), beta=cfg.beta, alpha=alpha, lam=lam,
                              top_k=cfg.top_k)
  tx = optax.adam(lr_schedule(cfg))

  def loss_fn(adapter, batch, rng):  # the row mean, weight 1
    s, w, st = picl_fn(lora.merge(batch["base"], adapter, lcfg), batch, rng)
    return s / w, 1.0, st
  return step_lib.jit_train_step(step_lib.make_train_step(loss_fn, tx)), tx


def _train(model, cfg: Config, pairs: dict, sft: dict | None, lam: float, alpha: float, log, name: str):
  """LoRA (q, k, v, o) trained on PICL (or DPO only) for cfg.steps; returns the merged params."""
  lcfg = lora_config(cfg)
  step, tx = train_step(model.cfg, cfg, lam, alpha)
  state = state_lib.create(lora.init(lcfg, model.params, jax.random.PRNGKey(cfg.seed + 5)), tx)

  rng = np.random.default_rng(cfg.seed + 7)
  n_pairs = len(pairs["chosen_inputs"])
  n_sft = len(sft["sft_inputs"]) if sft else 0
  for i in range(cfg.steps):
    pi = rng.choice(n_pairs, min(cfg.pairs_per_step, n_pairs), replace=False)
    batch = {k: v[pi] for k, v in pairs.items()}
    if sft:
      si = rng.choice(n_sft, min(cfg.sft_per_step, n_sft), replace=False)
      batch.update({k: v[si] for k, v in sft.items()})
    state, m = step(state, dict(shd.shard_rows(batch, model.mesh), base=model.params))
    log({"phase": name, "step": i, "loss": float(m["loss"]), **{k: float(m[k]) for k in picl.STATS}})
  return lora.merge(model.params, state.params, lcfg)


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # minutes of work at the cpu preset; recomputed
  t0 = time.time()
  metrics = open(os.path.join(out_dir, "metrics.jsonl"), "w")

  def log(rec):
    metrics.write(json.dumps(rec) + "\n")
    metrics.flush()

  attack, train, test = splits(cfg)
  mesh = shd.make_mesh(cfg.mesh) if cfg.mesh else None
  model = Model(cfg.model, cfg.gen_batch, cfg.max_new_tokens, cfg.seed, cfg.dtype, mesh, cfg.strategy)
  judge = refusal.Judge.trained() if cfg.judge == "trained" else refusal.Judge()

  def evaluate(personas):
    _, _, v = _asr(model, model.params, judge, personas, attack)
    k = len(attack)
    return [(sum(x == refusal.COMPLIANCE for x in v[i * k:(i + 1) * k]),
             sum(x == refusal.REFUSAL for x in v[i * k:(i + 1) * k]), k) for i in range(len(personas))]

  evo = evolve_personas(cfg, evaluate, False, log=lambda r: log({"phase": "ple", **r}))
  held = evolve_personas(cfg, evaluate, True, log=lambda r: log({"phase": "ple_heldout", **r}))
  attackers = elite(evo, cfg.attack_personas)  # the training personas
  testers, seed_testers = elite(held, cfg.attack_personas), seeds_of(held, cfg.attack_personas)
  data, entries = _problems(cfg.sft_rows + cfg.benign + cfg.utility, cfg.seed + 3)
  sft_e = entries[:cfg.sft_rows]
  benign_e = entries[cfg.sft_rows:cfg.sft_rows + cfg.benign]
  util_e = entries[cfg.sft_rows + cfg.benign:]
  splits_lib.record(out_dir, "pia", split_items(attack, train, test, attackers, testers + seed_testers, sft_e,
                                                benign_e, util_e))

  # training data
  _, train_resp, train_v = _asr(model, model.params, judge, attackers, train)
  eos = [model.tok.eos_id]
  persona_p, clean_p, chosen, rejected = [], [], [], []
  for j, (p, q) in enumerate((p, q) for p in attackers for q in train):
    persona_p.append(model.ids(wrap(p, q)))
    clean_p.append(model.ids(q))
    chosen.append(model.tok.encode(REFUSALS[j % len(REFUSALS)]) + eos)
    comply = train_resp[j] if train_v[j] == refusal.COMPLIANCE else COMPLIANT_OPENING
    rejected.append(model.tok.encode(comply) + eos)
  sft_prompts = [model.ids(e["question"] if i % 2 == 0 else wrap(attackers[i % len(attackers)], e["question"]))
                 for i, e in enumerate(sft_e)]
  sft_done = [model.tok.encode(f"The answer is {e['answer']}.") + eos for e in sft_e]
  need = max(max(len(x) + len(c) for x, c in zip(persona_p, chosen)),
             max(len(x) + len(r) for x, r in zip(persona_p, rejected)),
             max(len(x) + len(c) for x, c in zip(sft_prompts, sft_done)))
  length = -(-need // 32) * 32
  batch = picl.picl_batch(persona_p, clean_p, chosen, rejected, length, sft_prompts, sft_done,
                          pad_id=model.tok.batch_pad_id)
  batch = with_reference(reference_fn(model.cfg), model.params, batch, cfg.pairs_per_step, mesh)
  sft_keys = ("sft_inputs", "sft_targets", "sft_mask")
  sft = {k: batch.pop(k) for k in sft_keys}
  pairs = batch

  res = {"ple.asr_by_generation": evo.asr_by_generation, "ple.best_by_generation": evo.best_by_generation,
         "ple.elite_by_generation": evo.elite_by_generation, "ple.seed_asr": evo.seed_asr,
         "ple.best_asr": evo.best_asr, "ple.personas": len(evo.lineage.nodes),
         "ple.heldout_asr_by_generation": held.asr_by_generation, "ple.heldout_seed_asr": held.seed_asr,
         "ple.heldout_best_asr": held.best_asr, "ple.heldout_personas": len(held.lineage.nodes)}

  items = {}  # per (persona, prompt) or problem, in one order for every model: the claims' paired intervals

  def measure(params, name):  # ASR of the held-out personas (and, apart, of the training personas) on the test prompts
    res[f"asr.{name}"], _, verdicts = _asr(model, params, judge, testers, test)
    items[f"asr.{name}"] = [float(v == refusal.COMPLIANCE) for v in verdicts]
    res[f"asr.train_personas_{name}"] = _asr(model, params, judge, attackers, test)[0]
    for key, scores in (("over_refusal", _over_refusal(model, params, testers, benign_e)),
                        ("utility", _utility(model, params, data, util_e))):
      res[f"{key}.{name}"], items[f"{key}.{name}"] = float(np.mean(scores)), scores

  measure(model.params, "before")
  res["asr.seed_personas_before"], _, verdicts = _asr(model, model.params, judge, seed_testers, test)
  items["asr.seed_personas_before"] = [float(v == refusal.COMPLIANCE) for v in verdicts]
  picl_params = _train(model, cfg, pairs, sft, cfg.lam, cfg.alpha, log, "picl")
  measure(picl_params, "after_picl")
  del picl_params
  dpo_params = _train(model, cfg, pairs, None, 0.0, 0.0, log, "dpo_only")
  measure(dpo_params, "after_dpo_only")
  metrics.close()
  res["pairs"], res["seq_len"], res["seconds"] = len(persona_p), length, time.time() - t0
  res["per_item"] = items
  gens = list(range(len(evo.asr_by_generation)))
  registry.plot_curves(os.path.join(out_dir, "ple_asr.png"),
                       {"new personas": (gens, evo.asr_by_generation), "best so far": (gens, evo.best_by_generation),
                        "elite": (gens, evo.elite_by_generation),
                        "held-out best so far": (gens, held.best_by_generation)},
                       title="pia: PLE attack success rate by generation", xlabel="generation", ylabel="ASR")
  return res


# ------------------------------------------------------------------------------------------------ plan

# Sizes the plan cannot read before the run: a persona-wrapped AdvBench request in the chat format (the template,
# a persona of one to three sentences, the request; the run buckets prompts to 64 tokens) and a written refusal.
PLAN_PROMPT_TOKENS = 192
PLAN_REFUSAL_TOKENS = 32


def generation_calls(cfg: Config) -> int:
  """How many `Model.generate` batches a run samples: PLE's two evolutions (the seeds, then each generation's
  children, ceil(min_children / parents) x parents of them, on the attack prompts), the training personas' answers
  on the train prompts, the three measures (held-out and training personas on the test prompts, over-refusal,
  utility) and the held-out seeds on the test prompts."""
  def per(n):
    return -(-n // cfg.gen_batch)
  k = cfg.attack_personas
  children = -(-cfg.min_children // cfg.parents) * cfg.parents
  evolution = per(cfg.seeds * cfg.attack_prompts) + cfg.generations * per(children * cfg.attack_prompts)
  measure = 2 * per(k * cfg.test_prompts) + per(k * cfg.benign) + per(cfg.utility)
  return 2 * evolution + per(k * cfg.train_prompts) + 3 * measure + per(min(k, cfg.seeds) * cfg.test_prompts)


def _replicated(tree, mesh):
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep), tree)


def workloads(cfg: Config, mesh) -> list[plan_lib.Workload]:
  """What a run computes at `cfg`, for `experiments plan`: greedy generation (`Model.generate`, gen_batch prompts of
  PLAN_PROMPT_TOKENS, max_new_tokens new; PLE, the training responses and every measure), the reference pass over
  the pairs (`with_reference`, pairs_per_step at a time) and the PICL and DPO-only LoRA steps (`train_step`), with
  the model's params abstract and sharded by cfg.strategy over `mesh`, rows as `shard_rows` places them and the
  adapter state replicated. Train FLOPs: 6 N per token of the rows the loss differentiates plus 2 N per token of PIC's clean
  rows (stop-gradient)."""
  mcfg = model_config(cfg.model, cfg.dtype, cfg.dtype)
  params = abstract_params(mcfg, mesh, cfg.strategy)
  t = -(-(PLAN_PROMPT_TOKENS + cfg.max_new_tokens + 1) // 32) * 32
  p, s, w = cfg.pairs_per_step, cfg.sft_per_step, PLAN_REFUSAL_TOKENS
  i32 = np.int32
  pair = {k: ((p, t), i32) for k in ("chosen_inputs", "chosen_targets", "chosen_mask", "rejected_inputs",
                                     "rejected_targets", "rejected_mask")}
  ref_batch = shd.abstract_rows(pair, mesh)
  pic = {"clean_inputs": ((p, t), i32), "persona_index": ((p, w), i32), "clean_index": ((p, w), i32),
         "response_mask": ((p, w), i32), "has_persona": ((p,), np.bool_), "ref_chosen_logp": ((p,), np.float32),
         "ref_rejected_logp": ((p,), np.float32)}
  sft = {k: ((s, t), i32) for k in ("sft_inputs", "sft_targets", "sft_mask")}
  fwd = tfm.flops_per_token(mcfg, t) / 3 * t  # one row's forward
  stop = tuple(sorted({mcfg.eos_token_id} if isinstance(mcfg.eos_token_id, int) else set(mcfg.eos_token_id or ())))
  out = [generate_workload("generate", mcfg, params, cfg.gen_batch, PLAN_PROMPT_TOKENS, cfg.max_new_tokens,
                           generation_calls(cfg), stop=stop, pad_id=mcfg.pad_token_id or 0),
         plan_lib.Workload("reference_logprobs", "forward", reference_fn(mcfg), (params, ref_batch),
                           -(-cfg.attack_personas * cfg.train_prompts // p), 2 * p * fwd)]
  lcfg = lora_config(cfg)
  for name, lam, alpha, extra, rows in (("picl_step", cfg.lam, cfg.alpha, sft, 2 * p + s),
                                        ("dpo_step", 0.0, 0.0, {}, 2 * p)):
    step, tx = train_step(mcfg, cfg, lam, alpha)
    state = jax.eval_shape(lambda b, tx=tx: state_lib.create(lora.init(lcfg, b, jax.random.PRNGKey(0)), tx),
                           params)
    batch = shd.abstract_rows({**pair, **pic, **extra}, mesh)  # DPO-only keeps PIC's keys
    flops = 3 * rows * fwd + (p * fwd if lam else 0)
    out.append(plan_lib.Workload(name, "train", step, (_replicated(state, mesh), dict(batch, base=params)),
                                 cfg.steps, flops))
  return out
