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
from experiments._shared.chat_models import chat_ids, load_chat_model, resolve_model, stop_tokens
from jaxlab.adapters import lora
from jaxlab.data import tokenizers
from experiments.pia import refusal
from jaxlab.generate import sample
from jaxlab.models import transformer as tfm
from jaxlab.rl import dpo
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
  """The chat model, its tokenizer and bucketed greedy generation (few compiled shapes)."""

  def __init__(self, spec: str, gen_batch: int, max_new_tokens: int, seed: int):
    if spec == "tiny":
      self.tok = tokenizers.HFTokenizer.from_gguf(resolve_model("smollm2-135m-instruct"))
      self.cfg = tfm.Config.tiny(vocab_size=self.tok.vocab_size, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64,
                                 max_position_embeddings=2048, eos_token_id=self.tok.eos_id,
                                 pad_token_id=self.tok.batch_pad_id)
      self.params = tfm.init(self.cfg, jax.random.PRNGKey(seed))
    else:
      self.cfg, self.params, self.tok = load_chat_model(spec)
    self.gen_batch, self.max_new_tokens = gen_batch, max_new_tokens
    self.stops = stop_tokens(self.cfg, self.tok)

  def ids(self, text: str) -> list[int]:
    return chat_ids(self.tok, text)

  def generate(self, params, texts: list[str]) -> list[str]:
    rows = [self.ids(t) for t in texts]
    t = -(-max(map(len, rows)) // 64) * 64
    pad = self.tok.batch_pad_id
    out = []
    for s in range(0, len(rows), self.gen_batch):
      chunk = rows[s:s + self.gen_batch]
      b = self.gen_batch if len(rows) > self.gen_batch else -(-len(chunk) // 8) * 8
      ids, mask = np.full((b, t), pad, np.int32), np.zeros((b, t), np.int32)
      for i, r in enumerate(chunk + [chunk[0]] * (b - len(chunk))):
        ids[i, t - len(r):], mask[i, t - len(r):] = r, 1
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


def _utility(model, params, data, entries) -> float:
  answers = model.generate(params, [e["question"] for e in entries])
  hits = []
  for a, e in zip(answers, entries):
    nums = re.findall(r"-?\d+(?:\.\d+)?", a.replace(",", ""))
    hits.append(float(data.score_answer(answer=nums[-1], entry=e) >= 1.0) if nums else 0.0)
  return float(np.mean(hits))


def _over_refusal(model, params, personas, entries) -> float:
  answers = model.generate(params, [wrap(p, e["question"]) for p in personas for e in entries])
  return float(np.mean([refusal.keyword_refusal(a) for a in answers]))


def _train(model, cfg: Config, pairs: dict, sft: dict | None, lam: float, alpha: float, log, name: str):
  """LoRA (q, k, v, o) trained on PICL (or DPO only) for cfg.steps; returns the merged params."""
  lcfg = lora.Config(rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=("q", "k", "v", "o"))
  picl_fn = picl.picl_loss_fn(model.cfg, beta=cfg.beta, alpha=alpha, lam=lam, top_k=cfg.top_k)
  tx = optax.adam(lr_schedule(cfg))

  def loss_fn(adapter, batch, rng):  # the row mean, weight 1; the frozen base params ride in the batch
    s, w, st = picl_fn(lora.merge(batch["base"], adapter, lcfg), batch, rng)
    return s / w, 1.0, st

  step = step_lib.jit_train_step(step_lib.make_train_step(loss_fn, tx))
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
    state, m = step(state, dict(batch, base=model.params))
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
  model = Model(cfg.model, cfg.gen_batch, cfg.max_new_tokens, cfg.seed)
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
  batch = dpo.reference_logprobs(model.params, model.cfg, [batch])[0]
  sft_keys = ("sft_inputs", "sft_targets", "sft_mask")
  sft = {k: batch.pop(k) for k in sft_keys}
  pairs = batch

  res = {"ple.asr_by_generation": evo.asr_by_generation, "ple.best_by_generation": evo.best_by_generation,
         "ple.elite_by_generation": evo.elite_by_generation, "ple.seed_asr": evo.seed_asr,
         "ple.best_asr": evo.best_asr, "ple.personas": len(evo.lineage.nodes),
         "ple.heldout_asr_by_generation": held.asr_by_generation, "ple.heldout_seed_asr": held.seed_asr,
         "ple.heldout_best_asr": held.best_asr, "ple.heldout_personas": len(held.lineage.nodes)}

  def measure(params, name):  # ASR of the held-out personas (and, apart, of the training personas) on the test prompts
    res[f"asr.{name}"] = _asr(model, params, judge, testers, test)[0]
    res[f"asr.train_personas_{name}"] = _asr(model, params, judge, attackers, test)[0]
    res[f"over_refusal.{name}"] = _over_refusal(model, params, testers, benign_e)
    res[f"utility.{name}"] = _utility(model, params, data, util_e)

  measure(model.params, "before")
  res["asr.seed_personas_before"] = _asr(model, model.params, judge, seed_testers, test)[0]
  picl_params = _train(model, cfg, pairs, sft, cfg.lam, cfg.alpha, log, "picl")
  measure(picl_params, "after_picl")
  del picl_params
  dpo_params = _train(model, cfg, pairs, None, 0.0, 0.0, log, "dpo_only")
  measure(dpo_params, "after_dpo_only")
  metrics.close()
  res["pairs"], res["seq_len"], res["seconds"] = len(persona_p), length, time.time() - t0
  gens = list(range(len(evo.asr_by_generation)))
  registry.plot_curves(os.path.join(out_dir, "ple_asr.png"),
                       {"new personas": (gens, evo.asr_by_generation), "best so far": (gens, evo.best_by_generation),
                        "elite": (gens, evo.elite_by_generation),
                        "held-out best so far": (gens, held.best_by_generation)},
                       title="pia: PLE attack success rate by generation", xlabel="generation", ylabel="ASR")
  return res
