"""Recipes used by several experiments (no experiment imports another; what they share lives here).

  data      `load_corpus`: a corpus by spec ("stdlib", "hf:NAME", a JSONL / parquet / text path)
  records   `dedupe`: the last metrics record per step (a resumed run re-logs steps), `median`
  recipes   `byte_model` (the byte-level LLaMA config), `optimizer` (clip + optimizer at a schedule, written
            once), `compute_dtype`, `train_step` (make -> jit) and `fit` (the step run by the train loop)
"""
