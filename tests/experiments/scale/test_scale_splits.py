"""scale's training and evaluation documents share no text, and the memory claim reads weights plus state."""
from jaxlab import data as data_lib
from jaxlab.data.corpus import split_by_hash
from jaxlab.models import transformer as tfm
from jaxlab.optim import memory
from experiments import registry
from experiments.runner import splits
from experiments.scale import run as scale_run


def _corpus():
  texts = [f"doc {i}\n" * (i % 5) for i in range(400)]  # i % 5 == 0: empty; many exact copies under distinct ids
  return data_lib.from_texts(texts, ids=[f"f{i}.py" for i in range(400)]), texts


def test_split_documents_are_disjoint_and_cover_the_hash_split():
  docs, texts = _corpus()
  train, val = scale_run.split_documents(docs, 0.2)
  h = splits.hashed({"train": {"documents": list(train)}, "test": {"documents": list(val)}})
  assert splits.overlaps(h) == []
  # brute force: train is the hash split's "train"; val is its "val" less texts found in train
  want_train = [t for i, t in enumerate(texts) if split_by_hash(f"f{i}.py", 0.2) == "train"]
  want_val = [t for i, t in enumerate(texts) if split_by_hash(f"f{i}.py", 0.2) == "val" and t not in want_train]
  assert list(train) == want_train and list(val) == want_val and want_val
  raw = splits.hashed({"train": {"documents": list(docs.split("train", 0.2))},
                       "test": {"documents": list(docs.split("val", 0.2))}})
  assert splits.overlaps(raw)  # the bare hash slice does share copies: the filter is what makes them disjoint


def test_memory_claim_reads_weights_plus_state_against_the_paper_table():
  ratios = scale_run.state_bytes_ratios(["llama-1b"])
  shapes = memory.param_shapes(tfm.PRESETS["llama-1b"], "bfloat16")
  p = memory.tree_bytes(shapes)
  want = (p + memory.state_bytes("scale", shapes)) / (p + memory.state_bytes("adamw", shapes))
  assert abs(ratios["model_and_optimizer_ratio.llama-1b"] - want) < 1e-6
  assert abs(want - 2.81 / 8.04) < 0.01  # the paper's table: 2.81 GB vs 8.04 GB at 1B (bf16)
  claim = {c.id: c for c in registry.get("scale").claims}["state_memory"]
  assert "model_and_optimizer_ratio.llama-1b" in claim.check
