"""LLaVA-style vision-language model: vision encoder -> MLP connector -> decoder LM.

Implements LLaVA (arXiv 2304.08485) with the LLaVA-1.5 connector (arXiv 2310.03744) as a configuration of
`jaxlab.models.multimodal`: the encoder is its `VIT` (CLIP, SigLIP or DINOv2 hidden states of `feature_layers`,
HF indexing, class token dropped with `feature_select="default"` or kept with "full"), the connector its 2-layer
GELU MLP, and the image features are spliced at the `tokens_per_image` copies of `image_token_id` per image in
order (row-major over the batch, images in order), as transformers' LLaVA does. The LM is
`jaxlab.models.transformer` run on the spliced embeddings, so captures and interventions work unchanged.

LatentLens (McGill-NLP/latentlens) trains only the connector, with encoder and LM frozen:
`connector_only(tx)` wraps an optax optimizer so that only `params["connector"]` changes.

Axes: B batch (of LM rows; of images for pixels and features), T positions, N image tokens per image,
H/W/C image height, width, channels, E vision width, D LM width, V vocab.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.models import multimodal
from jaxlab.models import transformer as tfm
from jaxlab.models import vit
from jaxlab.nn import layers


@dataclasses.dataclass(frozen=True)
class Config:
  vision: vit.Config = vit.PRESETS["clip-tiny"]
  text: tfm.Config = tfm.PRESETS["tiny"]
  image_token_id: int = 3
  feature_layers: tuple[int, ...] = (-2,)
  feature_select: multimodal.FeatureSelect = "default"
  connector_hidden: int | None = None  # None: the LM width (LLaVA)
  connector_activation: layers.Activation = "gelu"
  connector_bias: bool = True

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"vlm.Config: {msg}")
    features = multimodal.VitFeatures(self.vision, self.feature_layers, self.feature_select)  # validates them
    object.__setattr__(self, "feature_layers", features.feature_layers)
    if not 0 <= self.image_token_id < self.text.vocab_size:
      bad(f"image_token_id must be in [0, {self.text.vocab_size}), found {self.image_token_id}")
    _ = self.multimodal  # multimodal.Config validates the connector fields

  @property
  def multimodal(self) -> multimodal.Config:
    """This LLaVA as a `multimodal.Config` (its params are ours with "vision" named "encoder")."""
    return multimodal.Config(
        encoder=multimodal.VIT, encoder_cfg=multimodal.VitFeatures(self.vision, self.feature_layers,
                                                                   self.feature_select),
        text=self.text, mode="splice", placeholder_id=self.image_token_id, connector_hidden=self.connector_hidden,
        connector_activation=self.connector_activation, connector_bias=self.connector_bias, modality="image")

  @property
  def connector_dim(self) -> int:
    return self.connector_hidden or self.text.d_model

  @property
  def tokens_per_image(self) -> int:
    return self.multimodal.tokens_per_input

  @property
  def vision_layers_used(self) -> int:
    """Blocks the encoder must run to produce every feature layer."""
    return self.multimodal.encoder_cfg.layers_used

  @property
  def param_dtype(self) -> str:
    return self.text.param_dtype

  @classmethod
  def tiny(cls, **kw) -> "Config":
    return dataclasses.replace(cls(), **kw)

  def replace(self, **kw) -> "Config":
    """dataclasses.replace; `param_dtype=` sets it on both the vision and the text config."""
    if "param_dtype" in kw:
      dt = kw.pop("param_dtype")
      kw["vision"] = kw.get("vision", self.vision).replace(param_dtype=dt)
      kw["text"] = kw.get("text", self.text).replace(param_dtype=dt)
    return dataclasses.replace(self, **kw)


AXES = vit.AXES + multimodal.AXES  # logical axes of the vision tower, the LM and the connector


def _as_multimodal(params) -> dict:
  return {"encoder": params["vision"], "connector": params["connector"], "lm": params["lm"]}


def init(cfg: Config, key) -> dict:
  """{"vision": vit params, "connector": {"fc1", "fc2"}, "lm": transformer params}."""
  p = multimodal.init(cfg.multimodal, key)
  return {"vision": p["encoder"], "connector": p["connector"], "lm": p["lm"]}


def encode_images(params, pixels_BHWC, cfg: Config):
  """Image features in the LM's embedding space: [B, tokens_per_image, D]."""
  return multimodal.encode(_as_multimodal(params), pixels_BHWC, cfg.multimodal)


def image_mask(tokens_BT, cfg: Config):
  """[B, T] bool: the positions that receive image features."""
  return jnp.asarray(tokens_BT) == cfg.image_token_id


splice = multimodal.scatter  # splice(embeds_BTD, mask_BT, features_BND): masked positions get the features


class Output(NamedTuple):
  lm: tfm.Output  # the decoder's output: logits and whatever `capture` asked for
  image_mask_BT: Any  # [B, T] bool: positions holding image features
  image_features: Any = None  # [B, N, D] connector outputs, B images (None without images)

  @property
  def logits(self):
    return self.lm.logits


def forward(params, tokens_BT, pixels_BHWC, cfg: Config, *, attention_mask_BT=None, positions_BT=None,
            capture: Sequence[str] = (), intervention: tfm.Intervention | None = None,
            program: Sequence[int] | None = None) -> Output:
  """Runs the VLM.

  Args:
    tokens_BT: token ids with `tokens_per_image` image tokens per image (all images of row 0 first, then row 1).
    pixels_BHWC: the images, channels last, or None for text only.
    attention_mask_BT, positions_BT, capture, intervention, program: as in `transformer.forward`.
  """
  out = multimodal.forward(_as_multimodal(params), tokens_BT, pixels_BHWC, cfg.multimodal,
                           attention_mask_BT=attention_mask_BT, positions_BT=positions_BT, capture=capture,
                           intervention=intervention, program=program)
  return Output(lm=out.lm, image_mask_BT=out.feature_mask_BT, image_features=out.features)


def image_positions(tokens_BT, cfg: Config) -> list[np.ndarray]:
  """Per row, the (host) indices of its image tokens."""
  t = np.asarray(tokens_BT)
  return [np.flatnonzero(row == cfg.image_token_id) for row in t]


def connector_labels(params):
  """"connector" for the connector's params, "frozen" for the vision encoder's and the LM's."""
  return {k: jax.tree.map(lambda _, k=k: "connector" if k == "connector" else "frozen", v) for k, v in params.items()}


def connector_mask(params):
  """True for the connector's params (an optax mask)."""
  return jax.tree.map(lambda s: s == "connector", connector_labels(params))


def connector_only(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` on the connector, zero updates (and no optimizer state) for the frozen encoder and LM.

  Only the connector's gradient is needed: `jaxlab.losses.vlm_loss_fn(cfg, freeze=True)` skips the others in the
  backward pass.
  """
  return optax.multi_transform({"connector": tx, "frozen": optax.set_to_zero()}, connector_labels)
