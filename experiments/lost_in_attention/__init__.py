"""Residual-update geometry of a VLM's LM ("lost in attention", ICML 2026; see experiments.lost_in_attention.geometry) and task
accuracy under attention interventions.

On the connector-trained VLM of the latentlens experiment (reused from the `source` latentlens run, or from one of
its reproduce siblings `NAME.seedK` / `NAME-N`, whose VLM was trained with this `train` config; a bare name is
looked up beside this run's directory; otherwise the same VLM is trained here by `_shared.vlm_pipeline.train_vlm`),
each LM block's attention and MLP (FFN) updates are measured on teacher-forced "<bos> <image>xP caption"
sequences: RID = dS + dD (how much an update changes the rank and leaves the spans of the residual stream) and MixIG
(the change in token-mixing entropy), per layer and averaged over layers and examples. X is the residual stream
over the first `min_len` positions (image tokens and the start of the caption; `min_len` = the shortest
sequence of the evaluation batch, so no padding enters).

Task accuracy is the teacher-forced next-token accuracy on the caption's attribute words (colour, shape,
position, background: the tokens that depend on the image), for the unmodified model ("none") and under each
intervention, in every layer at once and in one layer at a time: "noise_delta" (Gaussian noise of the same
per-token norm in place of the attention update), "noise_qkv" (Gaussian Q/K/V weights with each matrix's own
standard deviation) and "fixed_attention" (uniform weights over the keys the causal mask allows). RID and MixIG are
also measured under each intervention in every layer (`rid.<module>.<intervention>`, `mixig.<module>.<intervention>`).

The full preset takes a LLaVA checkpoint (`vlm_path`: llava-hf/llava-1.5-7b-hf, or any LLaVA directory with
config.json, safetensors and tokenizer.json; bf16, params sharded over the `mesh`) and a JSON-lines file of
{"image": path relative to the file, "caption": text} (`captions_path`); accuracy is then over every caption token
(the first `max_caption_tokens`). Missing or malformed paths stop the run with an error naming the path.

  python -m experiments run lost_in_attention --preset cpu   # reuses runs/latentlens's VLM if trained alike
  python -m experiments run lost_in_attention --preset full --set captions_path=c.jsonl  # after hf download
  python -m experiments plan lost_in_attention --preset full --topology v5e-8

Paper: arXiv 2605.05668. Code read beside it: none public. Method, claims, presets and departures from the paper:
experiments/lost_in_attention/README.md.
"""
from __future__ import annotations

import dataclasses

from experiments import registry
from experiments._shared import vlm_pipeline as pipe
from experiments.runner.claims import Claim
from jaxlab import sharding as shd


IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)  # CLIP's
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
INTERVENTIONS = ("noise_delta", "noise_qkv", "fixed_attention")
MODULES = ("attention", "ffn")


@dataclasses.dataclass(frozen=True)
class Config:
  """lost_in_attention settings. `train` is trained only when no `source` run holds a VLM trained with it."""
  source: str = ""
  train: pipe.TrainConfig = pipe.TRAIN_PRESETS["smoke"]
  n_eval_scenes: int = 8
  eval_batch: int = 8
  noise_std: float | None = None  # noise_delta: None = the update's own per-token norm
  per_layer: bool = True  # also intervene in one layer at a time
  vlm_path: str | None = None
  captions_path: str | None = None
  prompt: str = "USER: <image>\nDescribe the image. ASSISTANT:"
  max_caption_tokens: int = 64  # full preset: captions cut to this many tokens, every row padded to one length
  mesh: str | None = None  # a checkpoint's params laid out on this mesh (`jaxlab.sharding.make_mesh`); None: one device
  strategy: shd.Strategy = "dp"  # and by these sharding rules
  seed: int = 0

  def __post_init__(self):
    for name in ("n_eval_scenes", "eval_batch", "max_caption_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"lost_in_attention.Config: {name} must be >= 1, found {getattr(self, name)}")
    if self.noise_std is not None and self.noise_std < 0:
      raise ValueError(f"lost_in_attention.Config: noise_std must be >= 0 or None, found {self.noise_std}")


PRESETS = {
    "smoke": Config(),
    "cpu": Config(source="latentlens", train=pipe.TRAIN_PRESETS["cpu"], n_eval_scenes=128, eval_batch=32),
    # LLaVA-1.5-7B (CLIP ViT-L/14-336, a 7B LLaMA-family LM), an LVLM of the kind the paper studies
    "full": Config(vlm_path=registry.Hub("llava-hf/llava-1.5-7b-hf"),
                   captions_path=registry.Required(
                       "--set captions_path=FILE: JSON lines {\"image\": path relative to the file, \"caption\": "
                       "text}, e.g. COCO val2017 images with captions_val2017.json (cocodataset.org)"),
                   n_eval_scenes=256, eval_batch=8, mesh="fsdp:-1", strategy="fsdp"),
}


registry.register(registry.Experiment(
    name="lost_in_attention", config_cls=Config, presets=PRESETS,
    run=registry.run_of("experiments.lost_in_attention.run"),
    description="RID / MixIG of attention vs FFN updates in the VLM's LM, accuracy under attention interventions",
    resume_may_change=("eval_batch", "source"), seed_key=("seed", "train.seed"),
    results=("vlm", "rid.<module>", "mixig.<module>", "delta_s.<module>", "delta_d.<module>", "rid.<module>.layer<l>",
             "mixig.<module>.layer<l>", "rid.<module>.<intervention>", "mixig.<module>.<intervention>",
             "accuracy.<intervention>", "accuracy.<intervention>.layer<l>?",
             "scored_tokens"),
    paper="lost_in_attention", claims=(
        Claim("rid", "attention updates change the residual stream's geometry less than FFN updates (RID)",
              "RID attention 0.06 vs FFN 0.21", "{rid.attention} < {rid.ffn}"),
        Claim("mixig", "attention updates mix tokens far more than FFN updates (MixIG)",
              "MixIG attention 0.61 vs FFN 0.02", "{mixig.attention} > {mixig.ffn}"),
        Claim("noise", "replacing every layer's attention update with Gaussian noise (NoiseDelta) does as well as the "
              "unmodified model or better",
              "as well or better on most benchmarks (abstract)", "{accuracy.noise_delta} >= {accuracy.none}",
              measurable="{accuracy.none} > 0",
              why="the unmodified model gets no scored token right, so no intervention can do worse"),
    )))
