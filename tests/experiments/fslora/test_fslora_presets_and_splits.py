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


TASKS = ("boolq", "piqa", "winogrande")


def _tasks_dir(root, sizes=(6, 14, 9), tests=(5, 3, 4), jsonl=("piqa",)):
  """Small commonsense task files in LLM-Adapters' layout (JSON arrays; JSON lines for `jsonl`)."""
  import json
  import os
  for t, n, m in zip(TASKS, sizes, tests):
    os.makedirs(root / t)
    for split, k in (("train", n), ("test", m)):
      recs = [{"instruction": f"{t} q{split[1]}{i}? a or b", "input": "", "output": f"the answer is {'ab'[i % 2]}",
               "answer": "ab"[i % 2]} for i in range(k)]
      text = "\n".join(map(json.dumps, recs)) if t in jsonl else json.dumps(recs)
      (root / t / f"{split}.json").write_text(text)
  return str(root)


def test_full_preset_reads_the_reference_tasks_by_directory():
  cfg = fslora_exp.PRESETS["full"]
  assert cfg.tasks == ("ARC-Challenge", "ARC-Easy", "boolq", "hellaswag", "openbookqa", "piqa", "social_i_qa",
                       "winogrande") and cfg.task_test_cap == 3000 and cfg.setup.train_path is None
  assert "LLM-Adapters" in cfg.tasks_dir  # a Required naming where the files come from


def test_tasks_load_with_task_labels_alpaca_prompts_and_a_test_cap(tmp_path):
  cfg = fslora_exp.Config(tasks_dir=_tasks_dir(tmp_path), tasks=TASKS, task_test_cap=4)
  train, test = fslora_run.load_tasks(cfg)
  assert [e.label for e in train] == [0] * 6 + [1] * 14 + [2] * 9
  assert [e.label for e in test] == [0] * 4 + [1] * 3 + [2] * 4
  e = train[7]
  assert e.prompt.endswith("### Instruction:\npiqa qr1? a or b\n\n### Response:\n") and e.answer == "b"
  assert e.target == "the answer is b"
  with pytest.raises(FileNotFoundError, match=r"expected hellaswag/train.json under .*, found no file") as err:
    fslora_run.load_tasks(fslora_exp.Config(tasks_dir=str(tmp_path), tasks=("hellaswag",)))
  assert "\n" not in str(err.value)
  with pytest.raises(ValueError, match="tasks_dir needs tasks"):
    fslora_exp.Config(tasks_dir=str(tmp_path), tasks=())


@pytest.mark.slow
def test_a_run_over_tasks_reports_each_task_and_their_mean(tmp_path):
  from experiments import registry
  over = [f"tasks_dir={_tasks_dir(tmp_path / 'tasks')}", "tasks=" + ",".join(TASKS), "setup.seq_len=256",
          "setup.model.max_position_embeddings=256"]
  _, res = registry.run_experiment("fslora", "smoke", out=str(tmp_path / "run"), overrides=over)
  for m in fslora_exp.PRESETS["smoke"].methods:
    accs = [res[f"task_accuracy.{m}.{t}"] for t in TASKS]
    assert res[f"accuracy.{m}"] == pytest.approx(np.mean(accs))
  items = registry.read_items(str(tmp_path / "run"))  # the claims' per-item scores: their mean is the figure
  for m in fslora_exp.PRESETS["smoke"].methods:
    assert np.mean(items[f"accuracy.{m}"]) == pytest.approx(res[f"accuracy.{m}"])
