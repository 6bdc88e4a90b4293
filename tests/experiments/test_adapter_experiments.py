"""experiments/cdka.py and experiments/fslora.py: smoke presets through the CLI / runner, checked against
independent oracles: trainable-parameter budgets recomputed from the model's shapes, upload bytes in closed form
from ranks, ratios and rounds, accuracies re-scored from the saved completions by a separate reading of the
problem text; plus the CDKA budget choice against brute force, the alignment analysis on updates of known
structure, path validation, and the full-preset code path on a tiny checkpoint + JSONL."""
import json
import math
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments._shared import adapters as common
from experiments import cdka as cdka_exp
from experiments.cdka import run as run_cdka_exp
from experiments import fslora as fslora_exp
from experiments.fslora import run as run_fslora_exp
from experiments import registry
from jaxlab.adapters import kron
from jaxlab.models import transformer as tfm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG = b"\x89PNG\r\n\x1a\n"


def _png(path):
  with open(path, "rb") as f:
    return f.read(8) == PNG


def _solve(prompt: str) -> int:
  """Oracle: the value a word problem asks for, read from its words."""
  m = re.fullmatch(r"Q: \w+ has (\d+) \w+\.((?: [^.]+\.)*) How many now\?\nA: ", prompt)
  assert m, prompt
  cur = int(m.group(1))
  for phrase in re.findall(r" ([^.]+)\.", m.group(2)):
    n = int(re.search(r"\d+", phrase).group())
    cur = {"Gets": cur + n, "Gives": cur - n, "Multiplies": cur * n}[phrase.split()[0]]
  return cur


def _said(completion: str):
  """The number a completion's first line ends with: the one right after its last '=', else its last number."""
  line = completion.split("\n")[0]
  if "=" in line:
    m = re.match(r"\s*(-?\d[\d,]*)", line.rsplit("=", 1)[1])
    return int(m.group(1).replace(",", "")) if m else None
  nums = re.findall(r"-?\d[\d,]*", line)
  return int(nums[-1].replace(",", "")) if nums else None


def _rescored(run_dir: str) -> dict:
  by_method: dict = {}
  with open(os.path.join(run_dir, "completions.jsonl")) as f:
    for line in f:
      r = json.loads(line)
      gold = _solve(r["prompt"])
      assert r["answer"] == str(gold)  # the task's own answer agrees with the reading of its text
      by_method.setdefault(r["method"], []).append(_said(r["completion"]) == gold)
  return {m: float(np.mean(v)) for m, v in by_method.items()}


def _target_shapes(model: tfm.Config) -> list[tuple[int, int]]:
  """(in, out) of every linear of one layer: q, k, v, o, gate, up, down."""
  hd = model.head_dim or model.d_model // model.n_heads
  q, kv, d, f = model.n_heads * hd, (model.n_kv_heads or model.n_heads) * hd, model.d_model, model.d_ff
  return [(d, q), (d, kv), (d, kv), (q, d), (d, f), (d, f), (f, d)]


@pytest.fixture(scope="module")
def cdka_run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("cdka") / "run")
  env = dict(os.environ, PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-m", "experiments", "run", "cdka", "--preset", "smoke", "--out", out],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return out, registry.read_results(out)


@pytest.fixture(scope="module")
def fslora_run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("fslora") / "run")
  _, res = registry.run_experiment("fslora", "smoke", out=out)
  return out, res


@pytest.mark.slow
def test_cdka_smoke_results(cdka_run):
  out, res = cdka_run
  cfg = cdka_exp.PRESETS["smoke"]
  model = cfg.setup.model
  for m in cfg.methods:
    assert np.isfinite(res[f"final_loss.{m}"]) and np.isfinite(res[f"test_loss.{m}"])
  # accuracies equal an independent re-scoring of every saved completion
  rescored = _rescored(out)
  assert set(rescored) == set(cfg.methods)
  for m in cfg.methods:
    assert math.isclose(res[f"accuracy.{m}"], rescored[m], abs_tol=1e-9)
  # budgets from the shapes: every param for full, r (in + out) per matrix for LoRA, r (out/r1 r2 + r1 in/r2)
  full = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(
      jax.eval_shape(lambda k: tfm.init(model, k), jax.random.PRNGKey(0))))
  shapes = _target_shapes(model)
  r, r1, r2 = (int(v) for v in re.fullmatch(r"r=(\d+),r1=(\d+),r2=(\d+)", res["cdka_config"]).groups())
  lora_n = model.n_layers * sum(cfg.lora_rank * (i + o) for i, o in shapes)
  cdka_n = model.n_layers * sum(r * (o // r1 * r2 + r1 * i // r2) for i, o in shapes)
  assert (res["trainable_params.full"], res["trainable_params.lora"], res["trainable_params.cdka"]) == \
      (full, lora_n, cdka_n)
  assert abs(cdka_n - lora_n) <= cfg.budget_tolerance * lora_n and (r1, r2) != (1, 1)
  # the rank bound of the chosen config beats LoRA's rank (what the budget buys)
  assert res["cdka_rank_bound"] == min(min(i, o, r * min(r2, o // r1) * min(r1, i // r2)) for i, o in shapes)
  assert res["cdka_rank_bound"] > cfg.lora_rank
  errs = {k: v for k, v in res.items() if k.startswith("alignment.rel_error.")}
  assert f"alignment.rel_error.r{cfg.lora_rank}_r11_r21" in errs and f"alignment.rel_error.r{r}_r1{r1}_r2{r2}" in errs
  assert all(0.0 <= v <= 1.0 for v in errs.values())
  assert all(-1.0 <= res[f"alignment.cosine.{m}"] <= 1.0 for m in ("lora", "cdka"))
  for name in ("loss.png", "alignment.png"):
    assert _png(os.path.join(out, name))
  phases = {json.loads(line).get("phase") for line in open(os.path.join(out, "metrics.jsonl"))}
  assert {"pretrain", "finetune", "eval", "alignment"} <= phases
  assert "| full |" in open(os.path.join(out, "table.md")).read()


@pytest.mark.slow
def test_fslora_smoke_results(fslora_run):
  out, res = fslora_run
  cfg = fslora_exp.PRESETS["smoke"]
  assert cfg.clients_per_round == cfg.n_clients  # every client every round: bytes have a closed form
  rescored = _rescored(out)
  for m in (*cfg.methods, "fslora_reweighted"):
    assert math.isclose(res[f"accuracy.{m}"], rescored[m], abs_tol=1e-9)
  # one rank-1 component of every target: L (in + out) float32 numbers
  per_component = cfg.setup.model.n_layers * sum(i + o for i, o in _target_shapes(cfg.setup.model)) * 4
  k = [max(1, min(cfg.rank, round(cfg.ratios[i % len(cfg.ratios)] * cfg.rank))) for i in range(cfg.n_clients)]
  assert res["upload_bytes.fedlora"] == cfg.rounds * cfg.n_clients * cfg.rank * per_component
  assert res["upload_bytes.fslora"] == res["upload_bytes.hetlora"] == res["upload_bytes.fslora_reweighted"] == \
      cfg.rounds * sum(k) * per_component
  for q in cfg.sweep_ratios:
    kq = max(1, round(q * cfg.rank))
    assert res[f"upload_bytes.fslora_q{q:g}"] == cfg.rounds * cfg.n_clients * kq * per_component
  assert res["upload_bytes.fslora"] < res["upload_bytes.fedlora"]
  assert _png(os.path.join(out, "accuracy_vs_bytes.png"))
  rounds = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  fed = [r for r in rounds if r.get("method") == "fedlora"]
  assert [r["round"] for r in fed] == list(range(1, cfg.rounds + 1))
  assert [r["upload_bytes"] for r in fed] == [(i + 1) * cfg.n_clients * cfg.rank * per_component
                                              for i in range(cfg.rounds)]


def _brute_force_best_rank(shapes, rank, tol):
  total = run_cdka_exp.lora_budget(shapes, rank)
  (d_in, d_out), best = next(iter(shapes.values()))[-2:], -1
  for r1 in range(1, d_out + 1):
    for r2 in range(1, d_in + 1):
      if any(s[-1] % r1 or s[-2] % r2 for s in shapes.values()):
        continue
      for r in range(1, 4 * rank * max(r1, r2) + 1):
        if abs(run_cdka_exp.cdka_budget(shapes, r, r1, r2) - total) <= tol * total:
          best = max(best, kron.rank_bound(d_in, d_out, r, r1, r2))
  return best


@pytest.mark.parametrize("shapes,rank", [
    ({"a/q/kernel": (2, 64, 64), "a/up/kernel": (2, 64, 192), "a/down/kernel": (2, 192, 64)}, 2),
    ({"a/q/kernel": (48, 48)}, 3),
    ({"a/q/kernel": (32, 96), "a/v/kernel": (32, 32)}, 1),
])
def test_choose_cdka_fits_budget_with_the_best_rank_bound(shapes, rank):
  c = run_cdka_exp.choose_cdka(shapes, rank, 0.05)
  total = sum(int(np.prod(s[:-2])) * rank * (s[-2] + s[-1]) for s in shapes.values())
  assert abs(c["params"] - total) <= 0.05 * total
  assert c["params"] == sum(int(np.prod(s[:-2])) * c["r"] * (s[-1] // c["r1"] * c["r2"] + c["r1"] * s[-2] // c["r2"])
                            for s in shapes.values())
  assert all(s[-1] % c["r1"] == 0 and s[-2] % c["r2"] == 0 for s in shapes.values())
  d_in, d_out = next(iter(shapes.values()))[-2:]
  assert kron.rank_bound(d_in, d_out, c["r"], c["r1"], c["r2"]) == _brute_force_best_rank(shapes, rank, 0.05)
  s = run_cdka_exp.choose_cdka(shapes, rank, 0.05, "shape")  # the other preference: same budget, divides every target
  assert abs(s["params"] - total) <= 0.05 * total
  assert all(x[-1] % s["r1"] == 0 and x[-2] % s["r2"] == 0 for x in shapes.values())


def test_alignment_recovers_the_structure_of_the_update():
  rng = np.random.default_rng(0)
  d_in, d_out, L = 16, 32, 2
  shapes = {"blk/w": (L, d_in, d_out)}
  base = {"blk": {"w": rng.normal(size=(L, d_in, d_out))}}
  low_rank = np.stack([rng.normal(size=(d_in, 2)) @ rng.normal(size=(2, d_out)) for _ in range(L)])
  a, b = rng.normal(size=(L, 2, 4, d_in // 4)), rng.normal(size=(L, 2, d_out // 4, 4))
  kron_sum = np.stack([sum(np.kron(b[l, i], a[l, i]) for i in range(2)).T for l in range(L)])  # [L, in, out]
  lora_cfg, kron_cfg = {"r": 2, "r1": 1, "r2": 1}, {"r": 2, "r1": 4, "r2": 4}
  for delta, exact, other in ((low_rank, lora_cfg, kron_cfg), (kron_sum, kron_cfg, lora_cfg)):
    full = {"blk": {"w": base["blk"]["w"] + delta}}
    adapted = {"blk": {"w": base["blk"]["w"] + 2.0 * delta}}  # same direction: cosine 1
    al = run_cdka_exp.alignment(base, full, {"same": adapted, "neg": {"blk": {"w": base["blk"]["w"] - delta}}},
                            shapes, [lora_cfg, kron_cfg], 0)
    assert al["rel_error"][run_cdka_exp.c_key(exact)] < 1e-6
    assert al["rel_error"][run_cdka_exp.c_key(other)] > 0.1
    assert math.isclose(al["cosine"]["same"], 1.0, abs_tol=1e-9)
    assert math.isclose(al["cosine"]["neg"], -1.0, abs_tol=1e-9)


def test_presets_validate_and_full_needs_paths(tmp_path):
  with pytest.raises(registry.OverrideError, match="setup.model_path.*setup.train_path.*setup.test_path"):
    registry.config_for("cdka", "full")
  with pytest.raises(ValueError, match="setup.model_path"):  # before any computation: no run files
    registry.run_experiment("fslora", "full", out=str(tmp_path / "f"))
  assert not os.path.exists(tmp_path / "f" / "metrics.jsonl")
  missing = common.Setup.full(model_path=str(tmp_path), train_path=str(tmp_path / "none.jsonl"),
                              test_path=str(tmp_path / "none.jsonl"))
  with pytest.raises(FileNotFoundError, match="setup.train_path"):
    common.check_paths(missing)
  with pytest.raises(FileNotFoundError, match="config.json"):
    common.check_paths(common.Setup.full(model_path=str(tmp_path), train_path=str(tmp_path),
                                         test_path=str(tmp_path)))
  with pytest.raises(ValueError, match="go together"):
    common.Setup(train_path="x.jsonl")
  with pytest.raises(registry.OverrideError, match="methods"):
    registry.apply_overrides(cdka_exp.PRESETS["smoke"], ["methods=dora"])
  with pytest.raises(registry.OverrideError, match="cdka_prefer"):
    registry.apply_overrides(cdka_exp.PRESETS["smoke"], ["cdka_prefer=big"])


def test_client_labels_fall_back_to_answer_length():
  from jaxlab.data.tasks import arithmetic
  exs = [arithmetic.Example("q", a, 0, a) for a in ("1", "12", "7", "123", "45")]
  assert run_fslora_exp.client_labels(exs).tolist() == [0, 1, 0, 2, 1]
  exs = [arithmetic.Example("q", "1", lab, "1") for lab in (0, 2, 1)]
  assert run_fslora_exp.client_labels(exs).tolist() == [0, 2, 1]


def _tiny_checkpoint(root):
  """A transformers-format LLaMA directory with a word-level tokenizer.json, plus GSM8K / MetaMathQA JSONL."""
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers
  from jaxlab import hf
  words = "what is plus times the answer #### = + 0 1 2 3 4 5 6 7 8 9 .".split()
  tok = tokenizers.Tokenizer(models.WordLevel(unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator([" ".join(words)] * 3, trainers.WordLevelTrainer(
      special_tokens=["<unk>", "<s>", "</s>", "<pad>"]))
  model_dir = os.path.join(root, "model")
  os.makedirs(model_dir)
  tok.save(os.path.join(model_dir, "tokenizer.json"))
  with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, f)
  v = tok.get_vocab()
  cfg = tfm.Config(vocab_size=32, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_position_embeddings=128,
                   bos_token_id=v["<s>"], eos_token_id=v["</s>"], pad_token_id=v["<pad>"])
  hf.save(model_dir, cfg, tfm.init(cfg, jax.random.PRNGKey(0)))
  train, test = os.path.join(root, "mm.jsonl"), os.path.join(root, "gsm.jsonl")
  with open(train, "w") as f:
    for a in range(12):
      f.write(json.dumps({"type": "GSM_AnsAug", "query": f"what is {a % 5} plus 2",
                          "response": f"{a % 5} + 2 = {a % 5 + 2} . The answer is: {a % 5 + 2}"}) + "\n")
  with open(test, "w") as f:
    for a in range(4):
      f.write(json.dumps({"question": f"what is {a} plus 2 .", "answer": f"{a} + 2 = {a + 2} #### {a + 2}"}) + "\n")
  return model_dir, train, test


def test_full_code_path_on_a_tiny_checkpoint_and_jsonl(tmp_path):
  model_dir, train, test = _tiny_checkpoint(str(tmp_path))
  setup = ["setup.model_path=" + model_dir, "setup.train_path=" + train, "setup.test_path=" + test,
           "setup.dtype=float32", "setup.seq_len=64", "setup.max_new_tokens=4", "setup.eval_batch=4"]
  cfg = registry.apply_overrides(cdka_exp.PRESETS["full"], setup + [
      "methods=cdka", "steps=2", "batch_size=4", "warmup_steps=0", "mesh=None", "lora_rank=2",
      "cdka_r=2", "cdka_r1=2", "cdka_r2=2", "log_every=1"])
  res = run_cdka_exp.run(cfg, str(tmp_path / "cdka"), False)
  model = _saved_model(model_dir)
  per_layer = sum(i + o for i, o in _target_shapes(model))
  assert res["trainable_params"]["cdka"] == model.n_layers * 2 * per_layer  # r1 = r2: LoRA rank r's budget
  assert res["cdka_config"] == "r=2,r1=2,r2=2" and 0.0 <= res["accuracy"]["cdka"] <= 1.0
  assert not os.path.exists(str(tmp_path / "cdka" / "base"))  # a loaded base is not re-saved
  rows = [json.loads(line) for line in open(tmp_path / "cdka" / "completions.jsonl")]
  assert [r["answer"] for r in rows] == ["2", "3", "4", "5"]  # GSM8K answers read after '####'
  fcfg = registry.apply_overrides(fslora_exp.PRESETS["full"], setup + [
      "setup.train_format=metamathqa", "setup.test_format=gsm8k", "rank=4", "clients_per_round=2", "n_clients=3",
      "local_steps=1", "local_batch=2", "rounds=1", "eval_every=1", "sweep_ratios=()", "methods=fslora",
      "ratios=(0.5,)", "tasks_dir=None"])  # single files in place of the task directory
  fres = run_fslora_exp.run(fcfg, str(tmp_path / "fslora"), False)
  assert fres["upload_bytes"]["fslora"] == 1 * 2 * 2 * model.n_layers * per_layer * 4  # rounds C k L (in+out) 4B


def _saved_model(path) -> tfm.Config:
  from jaxlab import hf
  return hf.load(path)[0]
