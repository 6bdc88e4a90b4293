"""spec_dllm's recorded splits: every problem a training step draws is apart from the evaluated ones (checked on the
hashed splits and by direct set intersection), the problems' texts are the model's digit order, and the
`speculative_dual_cache` method decodes as the speculative decoder over Fast-dLLM's dual cache."""
import dataclasses

import jax
import numpy as np

from experiments import registry
from experiments.runner import splits
from experiments.spec_dllm import PRESETS, speculative
from experiments.spec_dllm import run as spec_run
from jaxlab.models import mdm


def test_problem_text_is_the_reversed_digit_prompt():
  prompts, answers = spec_run.arithmetic(np.random.RandomState(0), 4, 3, 16, held_out=False)
  for p, a in zip(prompts, answers):
    text = spec_run.problem_text(p)
    x, y = text.rstrip("=").split("+")
    assert text.endswith("=") and len(x) == len(y) == 3
    # the answer area holds a + b least significant digit first: an oracle from the operands read back
    assert int(x[::-1]) + int(y[::-1]) == int("".join(str(d) for d in a[:4])[::-1])


def test_training_problems_are_disjoint_from_the_evaluated_ones():
  cfg = dataclasses.replace(PRESETS["smoke"], train_steps=200, eval_examples=256)  # 6,400 draws of 10^4 pairs
  data = spec_run.arithmetic_splits(cfg)
  train, test = data["train"]["problems"], data["test"]["problems"]
  assert len(train) == cfg.train_steps * cfg.batch_size and len(test) == cfg.eval_examples
  assert not set(train) & set(test)
  assert splits.overlaps(splits.hashed(data)) == []
  # the same number of problems drawn as training draws them would overlap: the check can fail
  drawn = spec_run.arithmetic(np.random.RandomState(1), cfg.eval_examples, cfg.digits, cfg.gen_length, False)[0]
  leaky = dict(data, test={"problems": [spec_run.problem_text(p) for p in drawn]})
  assert splits.overlaps(splits.hashed(leaky))


def test_the_run_records_its_splits(tmp_path):
  registry.load_all()
  data = spec_run.arithmetic_splits(PRESETS["smoke"])
  written = splits.record(str(tmp_path), "spec_dllm", data)
  assert splits.read(str(tmp_path)) == written
  assert len(written["test"]["problems"]) == len(set(data["test"]["problems"]))  # repeats are hashed once


def test_speculative_dual_cache_is_the_speculative_decoder_over_the_dual_cache():
  cfg = dataclasses.replace(PRESETS["smoke"], methods=("speculative_dual_cache",))
  mc = cfg.model
  params = jax.tree.map(lambda a: a * 20.0 if a.ndim >= 2 else a, mdm.init(mc, jax.random.key(0)))
  prompts = spec_run.eval_problems(cfg)[0][:4]
  got = spec_run.decode("speculative_dual_cache", params, mc, prompts, cfg, 0.5)
  ref = speculative.generate(params, mc, prompts, steps=cfg.gen_length, gen_length=cfg.gen_length,
                             block_length=cfg.block_length, threshold=0.5, cache="dual", strata=cfg.strata,
                             acceptance="confident", lookahead=cfg.lookahead)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(got.nfe, ref.nfe)
  # no cache decodes with inter-block lookahead: a different count of forwards or tokens on this model
  plain = spec_run.decode("speculative", params, mc, prompts, cfg, 0.5)
  assert (np.asarray(plain.tokens) != np.asarray(got.tokens)).any() or (plain.nfe != got.nfe).any()
