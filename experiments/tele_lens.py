"""Tele-Lens (arXiv 2602.02103): how far ahead a chat LM's hidden states plan its chain of thought.

The LM (SmolLM2-135M-Instruct by default) reads a chat-formatted question from `jaxlab.data.tasks.reasoning`
(Parity, Cycle, Subsum) and, teacher-forced, the task's templated CoT, "\nAnswer:" and the answer. At every CoT
position of every probed layer the hidden state is extracted once (cached under the run directory) and
probes of `jaxlab.interp.probes` are trained on the first half of the examples and scored on the second:
  horizon       top-5 accuracy of the token probe for delta = 1..8 tokens ahead (inside the CoT);
  final answer  accuracy of the answer probe (over the answer words of all tasks) at every CoT position;
  uncertainty   the LM's own answer after the CoT (its argmax over the task's answer words) is right or wrong;
                scores for being right: minus the pivot uncertainty (mean of the k = 5 lowest answer-probe
                entropies over the CoT, at `uncertainty_layer`), minus the mean of the k highest (the paper's
                top-k-highest-entropy baseline), the LM's self-certainty over the CoT, minus the CoT's
                perplexity; AUROC of each;
  CoT bypass    where the answer probe's normalized entropy falls below `bypass_threshold` within the first
                `bypass_window` CoT positions, the probe's answer replaces the CoT's; rate and accuracy change.
The CoT is the task's template rather than the model's own sampling (a 135M model's CoTs rarely finish), so
what is probed is how far the model's states anticipate a CoT it reads.

  python -m experiments run tele_lens --preset smoke
  python -m experiments run tele_lens --preset cpu
"""
from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from experiments import registry
from experiments._shared.chat_models import chat_ids, load_chat_model
from experiments.runner.claims import Claim
from jaxlab.data.tasks import reasoning
from jaxlab.interp import probes
from jaxlab.models import transformer as tfm

INSTRUCTION = " Think step by step, then give the answer."


@dataclasses.dataclass(frozen=True)
class Config:
  """tele_lens settings: `examples` per task (half train the probes), probed `layers` (HF convention)."""
  model: str = "smollm2-135m-instruct"
  tasks: tuple[str, ...] = ("parity", "cycle", "subsum")
  examples: int = 48
  layers: tuple[int, ...] = (6, 15, 24, 30)
  uncertainty_layer: int = 15
  horizon: int = 8
  rank: int = 256
  alpha: float = 256.0
  learning_rate: float = 1e-3
  epochs: int = 8
  batch_size: int = 256
  pivot_k: int = 5
  bypass_threshold: float = 0.1
  bypass_window: int = 4
  seed: int = 0

  def __post_init__(self):
    unknown = [t for t in self.tasks if t not in reasoning.TASKS]
    if not self.tasks or unknown:
      raise ValueError(f"tasks must be names from {sorted(reasoning.TASKS)}, found {self.tasks}")
    if self.examples < 4:
      raise ValueError(f"examples must be >= 4 per task (half train the probes), found {self.examples}")
    if not self.layers or list(self.layers) != sorted(set(self.layers)) or self.layers[0] < 0:
      raise ValueError(f"layers must be increasing distinct hidden-state indices >= 0, found {self.layers}")
    if self.uncertainty_layer not in self.layers:
      raise ValueError(f"uncertainty_layer must be one of layers {self.layers}, found {self.uncertainty_layer}")


PRESETS = {
    "smoke": Config(tasks=("parity",), examples=6, layers=(4, 15), uncertainty_layer=15, rank=32, alpha=32.0,
                    learning_rate=3e-3, epochs=2),
    "cpu": Config(),
    "full": Config(examples=400, epochs=20),
}


def build(cfg: Config, tok) -> list[dict]:
  """Examples with token ids: prompt, CoT, "\nAnswer:" and the one-token answer, and where each part starts."""
  rows = []
  for task in cfg.tasks:
    for i, ex in enumerate(reasoning.generate(task, cfg.examples, seed=cfg.seed)):
      prompt = chat_ids(tok, ex.prompt + INSTRUCTION)
      cot = tok.encode(ex.cot)
      slot = tok.encode("\nAnswer:")
      ans = tok.encode(" " + ex.answer)
      if len(ans) != 1:
        raise ValueError(f"answer {ex.answer!r} is {len(ans)} tokens; the answer probe reads one token")
      ids = prompt + cot + slot + ans
      choices = sorted({tok.encode(" " + a)[0] for a in reasoning.TASKS[task].answers})
      rows.append({"task": task, "split": "train" if i < cfg.examples // 2 else "test", "ids": ids,
                   "cot_start": len(prompt), "cot_end": len(prompt) + len(cot), "slot": len(ids) - 2,
                   "answer": ans[0], "choices": choices})
  return rows


def _lm_readouts(params, mcfg: tfm.Config, rows, answer_ids, batch: int = 8):
  """Per row: self-certainty and log-prob of the next CoT token at each position, and the answer-word logits at
  the answer slot (a plain forward; full-vocabulary logits never leave the device)."""
  answer_ids = jnp.asarray(answer_ids, jnp.int32)

  @jax.jit
  def fn(tokens_BT, mask_BT):
    logits = tfm.forward(params, tokens_BT, mcfg, attention_mask_BT=mask_BT).logits.astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, -1)
    sc = -jnp.mean(logp, -1) - jnp.log(logp.shape[-1])
    nxt = jnp.take_along_axis(logp[:, :-1], tokens_BT[:, 1:, None], -1)[..., 0]
    return sc, nxt, logits[..., answer_ids]

  out = []
  for i in range(0, len(rows), batch):
    part = rows[i:i + batch]
    t = -(-max(len(r["ids"]) for r in part) // 32) * 32
    tok = np.zeros((batch, t), np.int32)
    mask = np.zeros((batch, t), np.int32)
    for b, r in enumerate(part):
      tok[b, :len(r["ids"])], mask[b, :len(r["ids"])] = r["ids"], 1
    sc, nxt, ans = (np.asarray(x) for x in fn(tok, mask))
    for b, r in enumerate(part):
      out.append({"sc": sc[b], "next_logprob": nxt[b], "answer_logits": ans[b, r["slot"]]})
  return out


def run_with_model(cfg: Config, out_dir: str, mcfg: tfm.Config, params, tok, model_name: str) -> dict:
  rows = build(cfg, tok)
  if cfg.layers[-1] > mcfg.n_layers:
    raise ValueError(f"layers must be <= the model's {mcfg.n_layers} layers, found {cfg.layers}")
  seqs = [r["ids"] for r in rows]
  # CoT positions: from the token before the CoT (it predicts the CoT's first token) to the last CoT token
  pos = np.array([(i, t) for i, r in enumerate(rows) for t in range(r["cot_start"] - 1, r["cot_end"])])
  train = np.array([rows[i]["split"] == "train" for i in pos[:, 0]])
  ends = [r["cot_end"] for r in rows]
  tok_targets = probes.token_targets(seqs, pos, cfg.horizon, ends=ends)
  vocab = np.unique(np.concatenate([tok_targets[tok_targets >= 0], [r["answer"] for r in rows]]))
  y_tokens = probes.to_subset(tok_targets, vocab)
  answer_ids = sorted({a for r in rows for a in r["choices"]})
  y_answer = probes.to_subset([rows[i]["answer"] for i in pos[:, 0]], answer_ids)
  head_tokens, head_answer = probes.lm_head(params, vocab), probes.lm_head(params, answer_ids)
  base = probes.Config(d_model=mcfg.d_model, rank=cfg.rank, alpha=cfg.alpha, horizon=cfg.horizon,
                       learning_rate=cfg.learning_rate)
  cache = os.path.join(out_dir, "features")
  res, answer_probs = {}, {}
  records = []
  for layer in cfg.layers:
    h = probes.extract_cached(cache, model_name, params, mcfg, seqs, layer, pos)
    pc = base.replace(kind="tokens")
    p, losses = probes.train(pc, h[train], y_tokens[train], head_DV=head_tokens, epochs=cfg.epochs,
                             batch_size=cfg.batch_size, seed=cfg.seed)
    top5 = probes.topk_accuracy(probes.predict(p, pc, h[~train], head_tokens), y_tokens[~train], k=5)
    for d in range(1, cfg.horizon + 1):
      res[f"horizon.top5.layer{layer}.d{d}"] = float(top5[d - 1])
    pa = base.replace(kind="answer")
    p, losses_a = probes.train(pa, h[train], y_answer[train], head_DV=head_answer, epochs=cfg.epochs,
                               batch_size=cfg.batch_size, seed=cfg.seed)
    logits = probes.predict(p, pa, h, head_answer)
    res[f"final_answer_acc.layer{layer}"] = float(np.mean(logits[~train].argmax(-1) == y_answer[~train]))
    answer_probs[layer] = logits
    records.append({"layer": layer, "token_probe_loss": losses[-1], "answer_probe_loss": losses_a[-1],
                    "top5": [float(v) for v in top5]})
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  for d in range(1, cfg.horizon + 1):
    res[f"horizon.top5.mean.d{d}"] = float(np.nanmean([res[f"horizon.top5.layer{l}.d{d}"] for l in cfg.layers]))

  # uncertainty and bypass on the test half
  lm = _lm_readouts(params, mcfg, rows, answer_ids)
  ent = np.asarray(probes.entropy(answer_probs[cfg.uncertainty_layer]))
  norm_ent = ent / np.log(len(answer_ids))
  pred_probe = np.asarray(answer_ids)[answer_probs[cfg.uncertainty_layer].argmax(-1)]
  test = [i for i, r in enumerate(rows) if r["split"] == "test"]
  correct, pivot, high, sc, ppl, bypassed, bypass_right = [], [], [], [], [], [], []
  for i in test:
    r, here = rows[i], pos[:, 0] == i
    cols = [answer_ids.index(a) for a in r["choices"]]
    lm_answer = r["choices"][int(np.argmax(lm[i]["answer_logits"][cols]))]
    correct.append(lm_answer == r["answer"])
    every = np.ones((1, here.sum()), bool)
    pivot.append(float(probes.pivot_uncertainty(ent[here][None], every, cfg.pivot_k)[0]))
    high.append(float(probes.pivot_uncertainty(ent[here][None], every, cfg.pivot_k, highest=True)[0]))
    cot = slice(r["cot_start"] - 1, r["cot_end"] - 1)  # positions whose next token is a CoT token
    sc.append(float(np.mean(lm[i]["sc"][cot])))
    ppl.append(float(np.exp(-np.mean(lm[i]["next_logprob"][cot]))))
    early = np.nonzero(norm_ent[here][:cfg.bypass_window] < cfg.bypass_threshold)[0]
    bypassed.append(len(early) > 0)
    bypass_right.append(bool(pred_probe[here][early[0]] == r["answer"]) if len(early) else correct[-1])
  correct = np.asarray(correct)
  both = 0 < correct.sum() < len(correct)
  res["auroc.pivot"] = probes.auroc(-np.asarray(pivot), correct) if both else float("nan")
  res["auroc.topk_highest"] = probes.auroc(-np.asarray(high), correct) if both else float("nan")
  res["auroc.self_certainty"] = probes.auroc(np.asarray(sc), correct) if both else float("nan")
  res["auroc.perplexity"] = probes.auroc(-np.asarray(ppl), correct) if both else float("nan")
  res["bypass.rate"] = float(np.mean(bypassed))
  res["bypass.accuracy_change"] = float(np.mean(bypass_right) - np.mean(correct))
  res["lm_answer_acc"] = float(np.mean(correct))
  res["positions"], res["vocab_subset"] = int(len(pos)), int(len(vocab))
  ds = list(range(1, cfg.horizon + 1))
  registry.plot_curves(os.path.join(out_dir, "horizon.png"),
                       {f"layer {l}": (ds, [res[f"horizon.top5.layer{l}.d{d}"] for d in ds]) for l in cfg.layers},
                       title="tele_lens: probe top-5 accuracy by distance ahead", xlabel="delta (tokens ahead)",
                       ylabel="top-5 accuracy")
  return res


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # features are cached under out_dir; probes retrain in minutes
  mcfg, params, tok = load_chat_model(cfg.model)
  return run_with_model(cfg, out_dir, mcfg, params, tok, cfg.model)


registry.register(registry.Experiment(
    name="tele_lens", config_cls=Config, presets=PRESETS, run=run,
    description="Tele-Lens probes of SmolLM2 on Parity/Cycle/Subsum CoTs: horizon, final answer, pivot AUROC, bypass",
    paper="tele_lens", claims=(
        Claim("myopic", "probes predict the next token far better than the token 8 ahead (myopic horizon)",
              "top-5 accuracy falls steeply with the distance ahead",
              "{horizon.top5.mean.d1} >= 2 * {horizon.top5.mean.d8}"),
        Claim("pivot", "pivot uncertainty predicts CoT correctness better than self-certainty",
              "AUROC 0.69 vs 0.60", "{auroc.pivot} > {auroc.self_certainty}"),
    )))
