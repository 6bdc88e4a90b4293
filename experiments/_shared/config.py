"""Config blocks the training experiments share: the corpus, periodic evaluation and checkpoints.

An experiment's Config nests them as `corpus`, `eval` and `checkpoint` (`--set corpus.path=...`,
`--set eval.every=100`). `FLAT_KEYS` maps the flat keys these fields had before (`--set corpus=PATH`,
`eval_every=`, `ckpt_every=`, ...) to the nested ones; a Config that lists it as its `renamed_keys` class
variable keeps accepting them.
"""
from __future__ import annotations

import dataclasses

FLAT_KEYS = {"corpus": "corpus.path", "tokenizer": "corpus.tokenizer", "max_docs": "corpus.max_docs",
             "val_fraction": "corpus.val_fraction", "eval_every": "eval.every", "eval_batches": "eval.batches",
             "ckpt_every": "checkpoint.every", "keep_ckpts": "checkpoint.keep"}


@dataclasses.dataclass(frozen=True)
class Corpus:
  """path: "stdlib", "hf:NAME_OR_DIR", or a text/JSONL/parquet file, directory or glob
  (`experiments._shared.data.load_corpus`); tokenizer: "byte" or a tokenizer path; max_docs: keep the first
  `max_docs` documents (None: all); val_fraction: the share of documents held out by hash for validation."""
  path: str = "stdlib"
  tokenizer: str = "byte"
  max_docs: int | None = None
  val_fraction: float = 0.05

  def __post_init__(self):
    if not self.path:
      raise ValueError("corpus.path must be 'stdlib' or a path (text/JSONL/parquet file, directory or glob)")
    if self.max_docs is not None and self.max_docs < 1:
      raise ValueError(f"corpus.max_docs must be >= 1 or None, found {self.max_docs}")
    if not 0.0 < self.val_fraction < 1.0:
      raise ValueError(f"corpus.val_fraction must be in (0, 1), found {self.val_fraction}")


@dataclasses.dataclass(frozen=True)
class Eval:
  """every: steps between validation passes (0: only at the end); batches: validation batches per pass."""
  every: int = 0
  batches: int = 4

  def __post_init__(self):
    if self.every < 0:
      raise ValueError(f"eval.every must be >= 0 (0: only at the end), found {self.every}")
    if self.batches < 1:
      raise ValueError(f"eval.batches must be >= 1, found {self.batches}")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """every: steps between checkpoints (0: the experiment's default, said in its docstring); keep: how many
  of the newest checkpoints are kept."""
  every: int = 0
  keep: int = 2

  def __post_init__(self):
    if self.every < 0:
      raise ValueError(f"checkpoint.every must be >= 0, found {self.every}")
    if self.keep < 1:
      raise ValueError(f"checkpoint.keep must be >= 1, found {self.keep}")
