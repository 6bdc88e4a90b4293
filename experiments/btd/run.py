"""The run of btd: what `python -m experiments run btd` executes (its Config, presets and claims are in
`experiments/btd/__init__.py`, the paper and its departures in `experiments/btd/README.md`)."""
from __future__ import annotations

import json
import os

import numpy as np

from experiments import registry
from experiments._shared.chat_models import load_chat_model
from experiments.btd import aggregation as btd
from experiments.runner import splits
from jaxlab.generate import sample
from experiments.btd import Config, NAMES, PROMPT, VERDICT_TOKENS


def answer_pairs(dataset: str, n: int, tie_share: float, seed: int) -> tuple[list[dict], np.ndarray]:
  """n items {"question", "a", "b"} and their ratings y (1: A correct, 0: B correct, 0.5: both correct)."""
  import reasoning_gym  # a test/experiment dependency, imported where it is used
  rng = np.random.default_rng(seed)
  data = reasoning_gym.create_dataset(dataset, size=n, seed=seed)
  items, y = [], []
  for entry in data:
    right = str(entry["answer"]).strip()
    if rng.random() < tie_share:
      other = f"{right}.0" if "." not in right else f"{right}0"
      items.append({"question": entry["question"], "a": right, "b": other})
      y.append(0.5)
      continue
    value = float(right)
    wrong = value + float(rng.choice([-1, 1]) * rng.integers(1, 10))
    wrong = str(int(wrong)) if wrong == int(wrong) else f"{wrong:g}"
    assert data.score_answer(answer=wrong, entry=entry) < 1.0 <= data.score_answer(answer=right, entry=entry)
    a_right = bool(rng.random() < 0.5)
    a, b = (right, wrong) if a_right else (wrong, right)
    items.append({"question": entry["question"], "a": a, "b": b})
    y.append(1.0 if a_right else 0.0)
  return items, np.asarray(y, np.float32)


class Judge:
  """SmolLM2 (or any chat model) as a one-token verdict sampler."""

  def __init__(self, spec: str):
    self.cfg, self.params, self.tok = load_chat_model(spec)
    self.ids = {code: {ids[0] for ids in map(self.tok.encode, texts) if len(ids) == 1}
                for code, texts in VERDICT_TOKENS.items()}

  def _prompt(self, item: dict, history: str = "") -> list[int]:
    text = PROMPT.format(q=item["question"], a=item["a"], b=item["b"]) + history
    ids = self.tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=True)
    return ids + self.tok.encode("Verdict:")

  def _next_logits(self, prompts: list[list[int]]) -> np.ndarray:
    out = sample(self.params, self.cfg, prompts, 1, pad_id=self.tok.batch_pad_id, return_logits=True)
    return np.asarray(out.logits[:, 0], np.float64)

  def _code(self, token: int) -> int:
    return next((c for c, ids in self.ids.items() if token in ids), btd.UNPARSED)

  def sample_verdicts(self, items, n: int, temperature: float, seed: int) -> np.ndarray:
    """[I, n] verdict codes: n draws per item of the next token under softmax(logits / temperature)."""
    z = self._next_logits([self._prompt(it) for it in items]) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    rng = np.random.default_rng(seed)
    draws = np.stack([rng.choice(p.shape[1], size=n, p=row) for row in p])
    return np.vectorize(self._code)(draws)

  def __call__(self, items, samples):
    """Self-aggregation: the greedy final verdict after reading its own verdicts."""
    word = {btd.A: "A", btd.B: "B", btd.TIE: "Both", btd.UNPARSED: "unclear"}
    hist = ["\nYour earlier verdicts on this question: " + ", ".join(word[int(v)] for v in s) +
            ". Give your final verdict." for s in samples]
    z = self._next_logits([self._prompt(it, h) for it, h in zip(items, hist)])
    return [self._code(int(t)) for t in z.argmax(-1)]


def _code(verdict) -> int:
  return NAMES.get(str(verdict).strip().lower(), btd.UNPARSED)


def read_samples(path: str, samples: int, ns=()) -> tuple[np.ndarray, np.ndarray, dict, list[str]]:
  """([I, samples] verdict codes, [I] ratings, {n: [I] self-aggregation codes}, [I] item names) from a JSONL of
  {"verdicts": [...], "y": float, "self_aggregation": {"<n>": verdict}, "question" or "id": optional}: the judge's
  final verdict after reading its first n verdicts, for every n of `ns`. An item's name is its question, else its
  id, else "line <i>"."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"samples_path: expected a JSONL file of judge verdicts, found nothing at {path!r}")
  codes, ys, selfs, names = [], [], {n: [] for n in ns}, []
  with open(path) as f:
    for i, line in enumerate(x for x in f if x.strip()):
      rec = json.loads(line)
      v = [_code(s) for s in rec["verdicts"]]
      if len(v) < samples:
        raise ValueError(f"{path}: item {i} has {len(v)} verdicts, samples={samples} needs at least that many")
      agg = rec.get("self_aggregation", {})
      missing = [n for n in ns if str(n) not in agg]
      if missing:
        raise ValueError(f"{path}: item {i} lacks self_aggregation verdicts for n in {missing} (the judge's final "
                         "verdict after reading its first n verdicts, one of the paper's baselines)")
      for n in ns:
        selfs[n].append(_code(agg[str(n)]))
      codes.append(v[:samples])
      ys.append(float(rec["y"]))
      names.append(str(rec.get("question", rec.get("id", f"line {i}"))))
  return np.asarray(codes, np.int32), np.asarray(ys, np.float32), selfs, names


def split_items(names: list[str], half: int, kind: str) -> dict:
  """The splits: the first `half` items calibrate (train), the rest are evaluated (test)."""
  return {"train": {kind: names[:half]}, "test": {kind: names[half:]}}


def workloads(cfg: Config, mesh) -> list:
  """The accelerator work a run does at `cfg`, for `experiments plan`: none where verdicts come from
  `samples_path` (the full preset: the paper's judges sampled them elsewhere; reading them and fitting BTD is numpy
  on the host), and none worth planning otherwise (one SmolLM2-135M forward per item and a few short greedy
  self-aggregation answers, seconds on a CPU). Returns []."""
  del cfg, mesh
  return []


def run(cfg: Config, out_dir: str, resume: bool) -> dict:
  del resume  # minutes of work at the cpu preset; recomputed
  if cfg.samples_path is not None:
    verdicts, y, file_selfs, names = read_samples(cfg.samples_path, cfg.samples, cfg.ns)
    half = len(y) // 2
    splits.record(out_dir, "btd", split_items(names, half, "items"))
    self_scores = {n: np.array([btd.SCORES[c] for c in codes[half:]], np.float32) for n, codes in file_selfs.items()}
  else:
    items, y = answer_pairs(cfg.dataset, cfg.items, cfg.tie_share, cfg.seed)
    half = len(y) // 2
    splits.record(out_dir, "btd", split_items([it["question"] for it in items], half, "questions"))
    judge = Judge(cfg.judge)
    verdicts = judge.sample_verdicts(items, cfg.samples, cfg.temperature, cfg.seed + 1)
    self_scores = {n: btd.self_aggregation(judge, items[half:], verdicts[half:, :n].tolist()) for n in cfg.ns}
  rows = btd.evaluate(verdicts[:half], y[:half], verdicts[half:], y[half:], cfg.ns, prior=cfg.prior,
                      self_scores=self_scores)
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    for r in rows:
      f.write(json.dumps({k: v for k, v in r.items() if k not in ("abs_error", "right")}) + "\n")
  n_max = max(cfg.ns)
  short = {"majority": "majority", "soft_sc": "soft_sc", "self_aggregation": "self_agg", "btd": "btd",
           "btd_raw": "btd_raw"}
  res = {}
  for r in rows:
    if r["n"] == n_max:
      res[f"mae.{short[r['method']]}"] = r["mae"]
      res[f"pairwise_acc.{short[r['method']]}"] = r["pairwise_accuracy"]
      res.setdefault("per_item", {}).update({f"mae.{short[r['method']]}": r["abs_error"],
                                             f"pairwise_acc.{short[r['method']]}": r["right"]})
    if r["method"] == "btd":
      res[f"mae.btd.n{r['n']}"] = r["mae"]
  res["unparsed_share"] = float(np.mean(verdicts == btd.UNPARSED))
  res["verdict_share"] = {k: float(np.mean(verdicts == c)) for k, c in (("a", btd.A), ("b", btd.B),
                                                                         ("tie", btd.TIE))}
  res["judge_accuracy_single"] = float(np.mean(btd.verdicts(np.vectorize(btd.SCORES.get)(verdicts[:, 0]))
                                               == btd.verdicts(y)))
  res["items"], res["n_max"] = int(len(y)), n_max
  ns = list(cfg.ns)
  registry.plot_curves(os.path.join(out_dir, "mae_by_n.png"),
                       {m: (ns, [r["mae"] for r in rows if r["method"] == m]) for m in short
                        if any(r["method"] == m for r in rows)},
                       title="btd: MAE against ground truth by samples per item", xlabel="n", ylabel="MAE")
  return res
