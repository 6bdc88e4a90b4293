"""fslora: the full preset is the reference's run, and the clients' shards share no question with the test set."""
import numpy as np
import pytest

from experiments import fslora as fslora_exp
from experiments._shared import adapters
from experiments.fslora import run as fslora_run
from experiments.runner import splits
from jaxlab.adapters import fslora


def _normal_ranks_oracle(n, a, b, seed):
  np.random.seed(seed)  # the global legacy stream, as the reference seeds it
  x = np.random.normal((a + b) / 2, (b - a) / 6, n)
  return [int(v) for v in np.round(np.clip(x, a, b))]


def test_full_preset_resolves_to_the_reference_hyperparameters():
  cfg = fslora_exp.PRESETS["full"]
  fed = cfg.federation("fslora")
  assert (cfg.rank, cfg.n_clients, cfg.clients_per_round, cfg.local_steps, cfg.local_batch) == (64, 50, 10, 20, 4)
  assert fed.lora().scale == pytest.approx(1 / np.sqrt(64))  # alpha 1 with rsLoRA
  assert (cfg.local_opt, fed.local_lr, fed.local_weight_decay, fed.decay_rounds) == ("adamw", 3e-4, 0.01, 0)
  ks = _normal_ranks_oracle(50, 1, 32, 42)
  assert fed.client_k().tolist() == ks and min(ks) >= 1 and max(ks) <= 32
  assert fslora.Config(method="hetlora", rank=64, ratios=cfg.ratios).client_k().tolist() == ks
  assert cfg.rounds == 600 and cfg.eval_every == 20 and cfg.dirichlet_alpha == 0.1
  # the server optimizer is AdamW(3e-4, weight decay 0.01): one step on a pseudo-gradient g from params p
  tx = cfg.server_tx()
  p, g = {"w": np.full(3, 2.0, np.float32)}, {"w": np.asarray([1.0, -2.0, 0.5], np.float32)}
  upd, _ = tx.update(g, tx.init(p), p)
  want = -3e-4 * (g["w"] / (np.abs(g["w"]) + 1e-8) + 0.01 * p["w"])  # Adam's first step is sign(g)
  np.testing.assert_allclose(np.asarray(upd["w"]), want, rtol=1e-5)
  assert fslora_exp.PRESETS["cpu"].server_tx() is None  # FedAvg elsewhere


@pytest.mark.parametrize("preset", ["smoke", "cpu"])
def test_client_shards_and_test_questions_are_disjoint(preset):
  setup = fslora_exp.PRESETS[preset].setup
  train, test = adapters.load_examples(setup, 0)  # what `adapters.prepare` trains and tests on
  cfg = fslora_exp.PRESETS[preset]
  shards = fslora.dirichlet_split(fslora_run.client_labels(train), cfg.n_clients, cfg.dirichlet_alpha, seed=0)
  items = fslora_run.split_items(train, test, shards)
  assert sorted(i for s in shards for i in s) == list(range(len(train)))  # every training example is on a client
  assert not {e.prompt for e in train} & {e.prompt for e in test}  # brute force on the texts
  assert splits.overlaps(splits.hashed(items)) == []
  leaked = fslora_run.split_items(train, test + train[:3], shards)
  assert splits.overlaps(splits.hashed(leaked)) == [("test", "questions", 3)]
