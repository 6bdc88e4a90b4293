"""The run of pia: what `python -m experiments run pia` executes (its Config, presets and claims are in
`experiments/pia/__init__.py`, the paper and its departures in `experiments/pia/README.md`)."""
from __future__ import annotations

import json
import os
import re
import time

import jax
import numpy as np
import optax
import yaml

from experiments import registry
from experiments._shared.chat_models import chat_ids, load_chat_model, resolve_model, stop_tokens
from jaxlab.adapters import lora
from jaxlab.data import tokenizers
from experiments.pia import refusal
from jaxlab.generate import sample
from jaxlab.models import transformer as tfm
from jaxlab.rl import dpo
from jaxlab.train import state as state_lib, step as step_lib
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
  tx = optax.adam(cfg.lr)

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

  pcfg = ple.Config(generations=cfg.generations, parents=cfg.parents, min_children=cfg.min_children,
                    elite=cfg.elite, seed=cfg.seed)
  evo = ple.evolve(pcfg, ple.seed_personas(cfg.seeds, cfg.seed), evaluate, ple.TemplateMutator(),
                   log=lambda r: log({"phase": "ple", **r}))
  nodes = evo.lineage.nodes
  attackers = [nodes[i].text for i in evo.lineage.elite(cfg.attack_personas)]
  seed_attackers = ple.seed_personas(cfg.seeds, cfg.seed)[:cfg.attack_personas]

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
  data, entries = _problems(cfg.sft_rows + cfg.benign + cfg.utility, cfg.seed + 3)
  sft_e = entries[:cfg.sft_rows]
  benign_e = entries[cfg.sft_rows:cfg.sft_rows + cfg.benign]
  util_e = entries[cfg.sft_rows + cfg.benign:]
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
         "ple.best_asr": evo.best_asr, "ple.personas": len(nodes)}
  res["asr.before"] = _asr(model, model.params, judge, attackers, test)[0]
  res["asr.seed_personas_before"] = _asr(model, model.params, judge, seed_attackers, test)[0]
  res["over_refusal.before"] = _over_refusal(model, model.params, attackers, benign_e)
  res["utility.before"] = _utility(model, model.params, data, util_e)
  picl_params = _train(model, cfg, pairs, sft, cfg.lam, cfg.alpha, log, "picl")
  res["asr.after_picl"] = _asr(model, picl_params, judge, attackers, test)[0]
  res["over_refusal.after_picl"] = _over_refusal(model, picl_params, attackers, benign_e)
  res["utility.after_picl"] = _utility(model, picl_params, data, util_e)
  del picl_params
  dpo_params = _train(model, cfg, pairs, None, 0.0, 0.0, log, "dpo_only")
  res["asr.after_dpo_only"] = _asr(model, dpo_params, judge, attackers, test)[0]
  res["over_refusal.after_dpo_only"] = _over_refusal(model, dpo_params, attackers, benign_e)
  res["utility.after_dpo_only"] = _utility(model, dpo_params, data, util_e)
  metrics.close()
  res["pairs"], res["seq_len"], res["seconds"] = len(persona_p), length, time.time() - t0
  gens = list(range(len(evo.asr_by_generation)))
  registry.plot_curves(os.path.join(out_dir, "ple_asr.png"),
                       {"new personas": (gens, evo.asr_by_generation), "best so far": (gens, evo.best_by_generation),
                        "elite": (gens, evo.elite_by_generation)},
                       title="pia: PLE attack success rate by generation", xlabel="generation", ylabel="ASR")
  return res
