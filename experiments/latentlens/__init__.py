"""LatentLens (arXiv:2602.00462) against LogitLens and EmbeddingLens on visual tokens of a VLM, judged per layer.

The cpu preset has ground truth (`jaxlab.data.tasks.scenes`). The VLM is `experiments._shared.vlm_pipeline`'s: a
word-level text LM pretrained on caption-like and everyday text (160 words: 12 colours, 8 shapes, 6 backgrounds,
positions, function words and ~100 everyday words; the colour words also modify everyday nouns, as in real text), a
small ViT, and a connector trained alone to caption scenes. Two of the LM's text styles put a context prefix before
a caption (notes: the objects' attribute words; patch grid: one attribute word per patch in raster order, the
textual analogue of image tokens) and carry no loss on the prefix: the LM learns to read it, as a VLM's LM reads
image tokens, but is never trained to predict it, so, as in real VLMs, the LM head's next-token predictions at
visual positions are not trained towards describing the image. The LatentLens index runs the same frozen LM over
fresh texts of every style (no text about an evaluated scene; no image tokens) and stores the paper's layers
{1, 2, 4, 8, 16, 24, L-2, L-1} that the LM has (`default_index_layers`; (1, 2) for the cpu LM's L = 3). The visual
tokens at the paper's judged layers [0, 1, 2, 4, 8, 16, 24, L-2, L-1] (`default_judged_layers`; 0 = the connector's
outputs) are described by their top-5 tokens under each lens. The evaluated scenes are none of those the ViT and
the connector trained on.

What is judged: one judge, applied identically to the three lenses, sees only the five description tokens (for
LatentLens: the neighbours' tokens, duplicates included, without their contexts). A visual token is
interpretable when one of its five tokens names the patch's content: the colour or shape word of the object
covering the patch (`min_cover` of its pixels), or for a background patch "background" or the background's
colour word. Position, function and everyday words never count. As with the paper's judge, one matching word
out of five suffices, so a lens that lists many attribute words gains by chance; `interpretable.random.mean` is
the exact chance level of 5 distinct random vocabulary words. 62% of patches are background, and
"background" is right for every one of them, so a lens answering "background" everywhere would score ~62%;
the cpu preset therefore also reports the share over object patches only (`interpretable_object.<lens>.layer<l>`
/ `.mean`) and under a specific judge that requires the background's colour word on background patches
(`interpretable_specific.*`), besides the
background-patch share, the top-1 share and the captioning model's teacher-forced accuracy on attribute words.

The full preset runs the same evaluation on a real LLaVA checkpoint (`vlm_path`: llava-hf/llava-1.5-7b-hf, or any
LLaVA directory with its tokenizer.json; bf16, params sharded over the `mesh`), images from a folder and an index
corpus from a text file (one context per line), judging `full_patches_per_image` sampled patches per image; its
judge is a callable given as "module:name" (a `jaxlab.evals.judge.Judge` of `JudgeItem`s: an LLM judge gets the
image, the patch and the five words); without one it stops with an error.

  python -m experiments run latentlens --preset cpu
  python -m experiments run latentlens --preset full --set images_path=/imgs \\
      --set corpus_path=/data/phrases.txt --set judge=mypkg.judges:GPTJudge  # after its hf download
  python -m experiments plan latentlens --preset full --topology v5e-8

Paper: arXiv 2602.00462. Code read beside it: McGill-NLP/latentlens @ 36de5cbd1538. Method, claims, presets and
departures from the paper: experiments/latentlens/README.md.
"""
from __future__ import annotations

import dataclasses

from experiments import registry
from experiments._shared import vlm_pipeline as pipe
from experiments.runner.claims import Claim
from jaxlab import sharding as shd
from jaxlab.interp import lenses


LENSES = ("latentlens", "logitlens", "embeddinglens")


@dataclasses.dataclass(frozen=True)
class Config:
  """latentlens settings: the VLM's training (cpu pipeline), the index and the evaluation."""
  train: pipe.TrainConfig = pipe.TRAIN_PRESETS["smoke"]
  index_styles: tuple[float, float, float, float, float] = (0.2, 0.2, 0.2, 0.2, 0.2)  # scenes.text_corpus
  n_eval_scenes: int = 8
  index_texts: int = 100
  max_contexts: int = 20
  index_dtype: lenses.StorageDType = "bfloat16"
  index_layers: tuple[int, ...] | None = None  # None: the paper's {1, 2, 4, 8, 16, 24, L-2, L-1} within 0 .. L-1
  judged_layers: tuple[int, ...] | None = None  # None: the paper's [0, 1, 2, 4, 8, 16, 24, L-2, L-1] within 0 .. L-1
  top_k: int = 5
  eval_batch: int = 8
  seed: int = 0
  vlm_path: str | None = None  # full preset: a LLaVA checkpoint directory with tokenizer.json
  images_path: str | None = None
  corpus_path: str | None = None
  prompt: str = "USER: <image>\nDescribe the image. ASSISTANT:"
  image_mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
  image_std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
  judge: str = ""  # "module:name" of a Judge (a class is instantiated without arguments)
  full_patches_per_image: int = 4  # full preset: patches judged per image (sampled)
  index_batch: int = 32  # contexts per index forward pass
  index_bucket: int = 64  # index passes' lengths are padded to a multiple of this
  mesh: str | None = None  # a checkpoint's params laid out on this mesh (`jaxlab.sharding.make_mesh`); None: one device
  strategy: shd.Strategy = "dp"  # and by these sharding rules

  def __post_init__(self):
    for name in ("n_eval_scenes", "index_texts", "max_contexts", "top_k", "eval_batch", "full_patches_per_image",
                 "index_batch", "index_bucket"):
      if getattr(self, name) < 1:
        raise ValueError(f"latentlens.Config: {name} must be >= 1, found {getattr(self, name)}")
    if self.index_dtype not in lenses.DTYPES:
      raise ValueError(f"latentlens.Config: index_dtype must be one of {sorted(lenses.DTYPES)}, found "
                       f"{self.index_dtype!r}")
    for name in ("index_layers", "judged_layers"):
      v = getattr(self, name)
      if v is not None and (not v or min(v) < 0 or list(v) != sorted(set(v))):
        raise ValueError(f"latentlens.Config: {name} must be None or increasing distinct layers >= 0, found {v}")


PRESETS = {
    "smoke": Config(),
    "cpu": Config(train=pipe.TRAIN_PRESETS["cpu"], n_eval_scenes=128, index_texts=3000, max_contexts=50,
                  eval_batch=32),
    # LLaVA-1.5-7B: CLIP ViT-L/14-336 and a 7B LLaMA-family LM joined by an MLP connector, the paper's recipe in
    # the LLaVA layout jaxlab loads (the paper's own VLMs are Molmo-codebase checkpoints)
    "full": Config(vlm_path=registry.Hub("llava-hf/llava-1.5-7b-hf"),
                   images_path=registry.Required(
                       "--set images_path=DIR: a folder of images to judge (the paper judges PixMo-Cap images, "
                       "listed by URL in hf download allenai/pixmo-cap --repo-type dataset)"),
                   corpus_path=registry.Required(
                       "--set corpus_path=FILE: one phrase a line (the paper indexes ~3M Visual Genome region "
                       "descriptions: hf download ranjaykrishna/visual_genome --repo-type dataset, "
                       "region_descriptions)"),
                   n_eval_scenes=100, index_texts=1_000_000, max_contexts=20, index_dtype="float8_e4m3fn",
                   eval_batch=8, mesh="fsdp:-1", strategy="fsdp"),
}


# ------------------------------------------------------------------------------------------ judges


# ------------------------------------------------------------------------------------------ evaluation


registry.register(registry.Experiment(
    name="latentlens", config_cls=Config, presets=PRESETS, run=registry.run_of("experiments.latentlens.run"),
    description="LatentLens vs LogitLens/EmbeddingLens on a connector-trained VLM, judged per layer",
    resume_may_change=("eval_batch", "judge"), seed_key=("seed", "train.seed"),
    results=("interpretable.<lens>.layer<l>", "interpretable.<lens>.mean", "latentlens_over_logitlens",
             "latentlens_above_logitlens_every_layer", "visual_token_norm.layer<l>", "text_embedding_norm",
             "index_layers", "judged_layers", "index_rows", "visual_tokens",
             # the cpu pipeline's scenes only: captioning, training losses, object patches, chance
             "caption_attribute_accuracy?", "caption_accuracy.<attribute>?", "final_loss.<stage>?",
             "interpretable.random.mean?", "interpretable_object.<lens>.mean?", "interpretable_object.<lens>.layer<l>?",
             "interpretable_background.<lens>.mean?", "interpretable_specific.<lens>.mean?",
             "interpretable_specific.<lens>.layer<l>?", "object_patch_share?", "interpretable_top1.<lens>.mean?"),
    paper="latentlens", claims=(
        Claim("beats_logitlens", "LatentLens describes more visual tokens interpretably than LogitLens",
              "68% vs 24% (mean over models)", "{interpretable.latentlens.mean} > {interpretable.logitlens.mean}",
              diff=("interpretable.latentlens.mean", "interpretable.logitlens.mean")),
        Claim("beats_embeddinglens", "LatentLens describes more visual tokens interpretably than EmbeddingLens",
              "68% vs 32% (mean over models)",
              "{interpretable.latentlens.mean} > {interpretable.embeddinglens.mean}",
              diff=("interpretable.latentlens.mean", "interpretable.embeddinglens.mean")),
        Claim("objects", "on object patches alone, LatentLens beats both baselines", "(not separated in the paper)",
              "{interpretable_object.latentlens.mean} > max({interpretable_object.logitlens.mean}, "
              "{interpretable_object.embeddinglens.mean})",
              diff=(("interpretable_object.latentlens.mean", "interpretable_object.logitlens.mean"),
                    ("interpretable_object.latentlens.mean", "interpretable_object.embeddinglens.mean"))),
    )))
