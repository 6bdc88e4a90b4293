"""experiments/scale.py: the smoke preset end to end through the CLI, --resume of a finished run, the state-bytes
ratios against a closed form from the LLaMA shapes, and the full preset's paper schedule per size."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import registry
from experiments import scale as scale_exp
from experiments.scale import run as run_scale_exp
from jaxlab.models import transformer as tfm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _cli(*args):
  env = dict(os.environ, PYTHONPATH=REPO)
  proc = subprocess.run([sys.executable, "-m", "experiments", *args], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def _scale_over_adamw_state(cfg: tfm.Config) -> float:
  """Closed form: AdamW keeps two moments of every param; SCALE two moments of the vectors (norm gains) and one
  EMA buffer shaped like the untied LM head (all fp32; the int32 step counters are negligible)."""
  d, f, n, v, hk, gk = cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.vocab_size, cfg.n_heads * cfg.kdim, \
      cfg.kv_heads * cfg.kdim
  vectors = n * 2 * d + d
  matrices = v * d + n * (d * hk + 2 * d * gk + hk * d + 3 * d * f) + d * v
  return (2 * vectors + d * v) / (2 * (vectors + matrices))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("scale") / "run")
  _cli("run", "scale", "--preset", "smoke", "--out", out)
  return out, registry.read_results(out)


@pytest.mark.slow
def test_smoke_writes_every_key_curve_and_table(smoke_run):
  out, res = smoke_run
  for opt in scale_exp.OPTIMIZERS:
    assert np.isfinite(res[f"val_loss.{opt}"]), opt
    assert res[f"val_loss.{opt}"] < res["initial_val_loss"], opt  # every optimizer trained
  for size in scale_exp.SIZES:
    assert 0 < res[f"state_bytes_ratio.{size}"] < 1
  assert np.isfinite(res["step_time_ratio.scale_vs_adamw"]) and res["step_time_ratio.scale_vs_adamw"] > 0
  assert res["tokens"] == 4 * 8 * 32  # steps x batch x seq, the same for every optimizer
  with open(os.path.join(out, "val_loss.png"), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  table = open(os.path.join(out, "table.md")).read()
  assert all(f"| {opt} |" in table for opt in scale_exp.OPTIMIZERS)
  logged = {json.loads(line)["optimizer"] for line in open(os.path.join(out, "metrics.jsonl"))}
  assert logged == set(scale_exp.OPTIMIZERS)
  assert "val_loss.png" in open(os.path.join(out, "summary.md")).read()


@pytest.mark.slow
def test_state_bytes_ratio_matches_shapes(smoke_run):
  _, res = smoke_run
  assert res["state_bytes_ratio.llama-1b"] < 0.15
  for size in scale_exp.SIZES:
    np.testing.assert_allclose(res[f"state_bytes_ratio.{size}"], _scale_over_adamw_state(tfm.PRESETS[size]),
                               rtol=1e-6)
  ratios = [res[f"state_bytes_ratio.{s}"] for s in scale_exp.SIZES]
  assert ratios == sorted(ratios, reverse=True)  # the LM head's share shrinks with model size


@pytest.mark.slow
def test_resume_of_finished_run_keeps_results(smoke_run):
  out, res = smoke_run
  again = _cli("run", "scale", "--preset", "smoke", "--out", out, "--resume")
  assert "scale:adamw" not in again.stderr  # no optimizer trained again
  res2 = registry.read_results(out)
  for opt in scale_exp.OPTIMIZERS:
    assert res2[f"val_loss.{opt}"] == res[f"val_loss.{opt}"]
  assert np.isfinite(res2["step_time_ratio.scale_vs_adamw"])


def test_full_preset_follows_paper_schedule_per_size():
  full = scale_exp.PRESETS["full"]
  assert (full.batch_size, full.seq_len, full.lr_floor, full.schedule) == (512, 256, 0.1, "cosine")
  for size, (lr, warmup, steps, adam_lr) in {"llama-60m": (1e-3, 1100, 11000, 2e-2),
                                             "llama-1b": (2e-4, 10000, 100000, 1e-3),
                                             "llama-7b": (1e-4, 15000, 150000, 1e-3)}.items():
    cfg = registry.apply_overrides(full, [f"size={size}"])
    plan = run_scale_exp.resolve(cfg, vocab_size=32100)
    assert (plan.steps, plan.warmup_steps, plan.lr["scale"], plan.lr["vector"]) == (steps, warmup, lr, adam_lr)
    assert plan.model.d_model == tfm.PRESETS[size].d_model and plan.model.vocab_size == 32100
    assert plan.model.dtype == "bfloat16" and plan.model.param_dtype == "float32"
  cfg = registry.apply_overrides(full, ["size=llama-130m", "steps=500", "warmup_steps=50", "lr.scale=3e-3",
                                       "rank=64"])
  plan = run_scale_exp.resolve(cfg)
  assert (plan.steps, plan.warmup_steps, plan.lr["scale"], plan.lr["adamw"], plan.rank) == (500, 50, 3e-3, 1e-3, 64)
  with pytest.raises(registry.OverrideError, match="size"):
    registry.apply_overrides(full, ["size=llama-3b"])
  with pytest.raises(registry.OverrideError, match="corpus.path is required .*corpus.tokenizer is required"):
    registry.config_for("scale", "full")


def test_validation_rows_are_the_reference_truncate_and_pad_set():
  from jaxlab import data as data_lib
  tok = data_lib.load_tokenizer("byte")
  docs = ["abcdefghijklmnopqrstuvwxyz" * (i % 3 + 1) for i in range(20)] + ["x"]  # "x" + eos: one prediction
  batches, used = run_scale_exp.truncated_rows(docs, tok, seq_len=32, batch=4, tokens=200, seed=42)
  order = [docs[i] for i in np.random.RandomState(42).permutation(len(docs))]
  rows, taken, want_rows = [], 0, []
  for d in order:  # brute force: whole batches while fewer than 200 real tokens are taken
    if taken >= 200 and len(rows) % 4 == 0:
      break
    ids = list(d.encode()) + [tok.eos_id]
    ids = ids if len(ids) <= 32 else ids[:31] + [tok.eos_id]
    rows.append(d)
    want_rows.append(ids)
    taken += len(ids)
  assert used == rows and len(batches) == -(-len(rows) // 4) and taken >= 200
  flat = {k: np.concatenate([b[k] for b in batches]) for k in ("inputs", "targets", "loss_mask")}
  for r, ids in enumerate(want_rows):
    n = len(ids) - 1
    assert flat["inputs"][r, :n].tolist() == ids[:-1] and flat["targets"][r, :n].tolist() == ids[1:]
    assert flat["loss_mask"][r].tolist() == [1] * n + [0] * (32 - n)
    assert flat["targets"][r, n - 1] == tok.eos_id
  assert not flat["loss_mask"][len(want_rows):].any()  # the last batch's empty rows
  from experiments.runner import splits
  _, kept = run_scale_exp.truncated_rows(docs, tok, 32, 4, 200, exclude=frozenset({splits.digest(docs[0])}))
  assert docs[0] not in kept and len(kept) >= len(used) - 1
  assert "val_path is required" in str(pytest.raises(registry.OverrideError, registry.config_for, "scale", "full",
                                                     ["corpus.path=c4", "corpus.tokenizer=t5"]).value)
