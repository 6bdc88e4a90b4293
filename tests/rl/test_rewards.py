"""Rewards: answer extraction, exact answers (string rule and reasoning-gym's own scorer), format, model-based
scores and weighted sums."""
import numpy as np
import pytest

from jaxlab.evals import answers
from jaxlab.rl import rewards


def test_extract_and_exact_answer():
  assert answers.extract_tagged("so <answer> 42 </answer> then <answer>43</answer>") == "43"
  assert answers.extract_tagged(r"thus \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
  assert answers.extract_tagged("no answer") is None
  fn = rewards.exact_answer()
  got = fn(["<answer>Paris.</answer>", "<answer>Lyon</answer>", "Paris"], [{"answer": "paris"}] * 3)
  np.testing.assert_array_equal(got, [1.0, 0.0, 0.0])
  custom = rewards.exact_answer(extract=lambda t: t.split()[-1], key="y")
  np.testing.assert_array_equal(custom(["x = 7"], [{"y": 7}]), [1.0])


def test_reasoning_gym_scorer():
  rg = pytest.importorskip("reasoning_gym")
  ds = rg.create_dataset("basic_arithmetic", size=2, seed=0)
  entries = [ds[0], ds[1]]
  fn = rewards.reasoning_gym_answer(ds)
  texts = [f"<answer>{entries[0]['answer']}</answer>", "<answer>-1</answer>" if entries[1]["answer"] != "-1" else "x"]
  np.testing.assert_array_equal(fn(texts, entries), [1.0, 0.0])


def test_format_model_and_combined_rewards():
  fmt = rewards.format_reward()
  np.testing.assert_array_equal(fmt(["think <answer>1</answer>", "<answer>1"], [{}, {}]), [1.0, 0.0])
  prm = rewards.model_reward(lambda texts, ex: [len(t) / 10 for t in texts])
  np.testing.assert_allclose(prm(["abc", "abcdefghij"], [{}, {}]), [0.3, 1.0])
  with pytest.raises(ValueError, match="scores"):
    rewards.model_reward(lambda t, e: [0.0])(["a", "b"], [{}, {}])
  both = rewards.combine((rewards.exact_answer(), 1.0), (fmt, 0.5))
  np.testing.assert_allclose(both(["<answer>1</answer>", "<answer>2</answer>"], [{"answer": 1}] * 2), [1.5, 0.5])
