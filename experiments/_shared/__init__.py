"""Code several experiments share (no experiment imports another; what they share lives here).

  adapters      the base model and the arithmetic / JSONL task of the adapter papers (cdka, fslora)
  config        the nested corpus / eval / checkpoint configs of the training experiments
  data          `load_corpus`: a corpus by spec ("stdlib", "hf:NAME", a JSONL / parquet / text path)
  records       `dedupe`: the last metrics record per step (a resumed run re-logs steps), `median`
  recipes       `byte_model` (the byte-level LLaMA config), `optimizer` (clip + optimizer at a schedule, written
                once), `compute_dtype`, `train_step` (make -> jit) and `fit` (the step run by the train loop)
  vlm_pipeline  the scene VLM of the VLM papers (latentlens, lost_in_attention), trained in three stages
"""
