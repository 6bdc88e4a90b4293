"""LLaVA-style vision-language model: vision encoder -> MLP connector -> decoder LM.

Implements LLaVA (arXiv 2304.08485) with the LLaVA-1.5 connector (arXiv 2310.03744).

The vision encoder (`jaxlab.models.vit`: CLIP, SigLIP or DINOv2) runs on the images; the hidden states of
`feature_layers` (HF indexing: 0 = embeddings, -1 = last block; several are concatenated on the feature axis)
have their first (class) token dropped with `feature_select="default"` or kept with "full", then a 2-layer GELU
MLP maps them to the LM width. The token sequence already holds `tokens_per_image` copies of `image_token_id`
per image; their embeddings are replaced by the image features in order (row-major over the batch, images in
order), as transformers' LLaVA does. The LM is `jaxlab.models.transformer` run on the spliced embeddings, so
captures and interventions work unchanged.

LatentLens (McGill-NLP/latentlens) trains only the connector, with encoder and LM frozen:
`connector_only(tx)` wraps an optax optimizer so that only `params["connector"]` changes.

Axes: B batch, T positions, N images, P image tokens per image, E vision width, D LM width, V vocab.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.models import transformer as tfm
from jaxlab.models import vit
from jaxlab.nn import axes, layers


@dataclasses.dataclass(frozen=True)
class Config:
  vision: vit.Config = vit.PRESETS["clip-tiny"]
  text: tfm.Config = tfm.PRESETS["tiny"]
  image_token_id: int = 3
  feature_layers: tuple[int, ...] = (-2,)
  feature_select: str = "default"  # "default": drop the first (class) token; "full": keep every token
  connector_hidden: int | None = None  # None: the LM width (LLaVA)
  connector_activation: str = "gelu"
  connector_bias: bool = True

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"vlm.Config: {msg}")
    if isinstance(self.feature_layers, int):
      object.__setattr__(self, "feature_layers", (self.feature_layers,))
    object.__setattr__(self, "feature_layers", tuple(int(x) for x in self.feature_layers))
    n = self.vision.n_layers
    if not self.feature_layers or any(not -(n + 1) <= x <= n for x in self.feature_layers):
      bad(f"feature_layers must be non-empty HF hidden-state indices in [{-(n + 1)}, {n}], found "
          f"{self.feature_layers}")
    if self.feature_select not in ("default", "full"):
      bad(f"feature_select must be 'default' or 'full', found {self.feature_select!r}")
    if self.feature_select == "default" and not self.vision.cls_token:
      bad("feature_select='default' drops the class token, but the vision encoder has none; use 'full'")
    if not 0 <= self.image_token_id < self.text.vocab_size:
      bad(f"image_token_id must be in [0, {self.text.vocab_size}), found {self.image_token_id}")
    if self.connector_activation not in layers.ACTIVATIONS:
      bad(f"connector_activation must be one of {sorted(layers.ACTIVATIONS)}, found {self.connector_activation!r}")
    if self.connector_hidden is not None and self.connector_hidden <= 0:
      bad(f"connector_hidden must be positive, found {self.connector_hidden}")

  @property
  def connector_dim(self) -> int:
    return self.connector_hidden or self.text.d_model

  @property
  def tokens_per_image(self) -> int:
    return self.vision.seq_len - (1 if self.feature_select == "default" else 0)

  @property
  def vision_layers_used(self) -> int:
    """Blocks the encoder must run to produce every feature layer."""
    return max(x % (self.vision.n_layers + 1) for x in self.feature_layers)

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


for _pat, _names, _fan_in in [
    (r"connector/fc1/kernel", ("embed", "mlp"), "embed"),
    (r"connector/fc1/bias", ("mlp",), None),
    (r"connector/fc2/kernel", ("mlp", "embed"), "mlp"),
    (r"connector/fc2/bias", ("embed",), None),
]:
  axes.register(_pat, _names, _fan_in)


def init(cfg: Config, key) -> dict:
  """{"vision": vit params, "connector": {"fc1", "fc2"}, "lm": transformer params}."""
  kv, kc1, kc2, kl = jax.random.split(key, 4)
  dt = jnp.dtype(cfg.param_dtype)
  e = cfg.vision.d_model * len(cfg.feature_layers)
  lin = lambda k, i, o: layers.linear_init(k, i, o, bias=cfg.connector_bias, std=cfg.text.init_std, dtype=dt)
  return {"vision": vit.init(cfg.vision, kv),
          "connector": {"fc1": lin(kc1, e, cfg.connector_dim), "fc2": lin(kc2, cfg.connector_dim, cfg.text.d_model)},
          "lm": tfm.init(cfg.text, kl)}


def encode_images(params, pixels_NHWC, cfg: Config):
  """Image features in the LM's embedding space: [N, tokens_per_image, D]."""
  out = vit.forward(params["vision"], pixels_NHWC, cfg.vision, capture_hidden_states=True,
                    n_layers=cfg.vision_layers_used)
  n_hs = cfg.vision.n_layers + 1
  feats = [out.hidden_states[x % n_hs] for x in cfg.feature_layers]
  if cfg.feature_select == "default":
    feats = [f[:, 1:] for f in feats]
  f = jnp.concatenate(feats, axis=-1)
  dt = jnp.dtype(cfg.text.dtype)
  h = layers.ACTIVATIONS[cfg.connector_activation](layers.linear(params["connector"]["fc1"], f, dt))
  return layers.linear(params["connector"]["fc2"], h, dt)


def image_mask(tokens_BT, cfg: Config):
  """[B, T] bool: the positions that receive image features."""
  return jnp.asarray(tokens_BT) == cfg.image_token_id


def splice(embeds_BTD, mask_BT, features_NPD):
  """Replaces the masked positions' embeddings by the features, in row-major order (transformers' masked_scatter)."""
  flat = features_NPD.reshape(-1, features_NPD.shape[-1]).astype(embeds_BTD.dtype)
  idx = jnp.cumsum(mask_BT.reshape(-1)) - 1
  picked = jnp.take(flat, jnp.clip(idx, 0, flat.shape[0] - 1), axis=0).reshape(embeds_BTD.shape)
  return jnp.where(mask_BT[..., None], picked, embeds_BTD)


class Output(NamedTuple):
  lm: tfm.Output  # the decoder's output: logits and whatever `capture` asked for
  image_mask_BT: Any  # [B, T] bool: positions holding image features
  image_features: Any = None  # [N, P, D] connector outputs (None without images)

  @property
  def logits(self):
    return self.lm.logits


def forward(params, tokens_BT, pixels_NHWC, cfg: Config, *, attention_mask_BT=None, positions_BT=None,
            capture: Sequence[str] = (), intervention: tfm.Intervention | None = None,
            program: Sequence[int] | None = None) -> Output:
  """Runs the VLM.

  Args:
    tokens_BT: token ids with `tokens_per_image` image tokens per image (all images of row 0 first, then row 1).
    pixels_NHWC: the images, channels last, or None for text only.
    attention_mask_BT, positions_BT, capture, intervention, program: as in `transformer.forward`.
  """
  tokens_BT = jnp.asarray(tokens_BT)
  mask = image_mask(tokens_BT, cfg)
  x = layers.embed(params["lm"]["embed"], tokens_BT, jnp.dtype(cfg.text.dtype))
  feats = None
  if pixels_NHWC is not None:
    n = pixels_NHWC.shape[0]
    if not isinstance(mask, jax.core.Tracer) and int(mask.sum()) != n * cfg.tokens_per_image:
      raise ValueError(f"{n} images need {n * cfg.tokens_per_image} image tokens ({cfg.tokens_per_image} each, id "
                       f"{cfg.image_token_id}); the tokens hold {int(mask.sum())}")
    feats = encode_images(params, pixels_NHWC, cfg)
    x = splice(x, mask, feats)
  out = tfm.forward(params["lm"], tokens_BT, cfg.text, inputs_embeds_BTD=x, attention_mask_BT=attention_mask_BT,
                    positions_BT=positions_BT, capture=capture, intervention=intervention, program=program)
  return Output(lm=out, image_mask_BT=mask, image_features=feats)


def image_positions(tokens_BT, cfg: Config) -> list[np.ndarray]:
  """Per row, the (host) indices of its image tokens."""
  t = np.asarray(tokens_BT)
  return [np.flatnonzero(row == cfg.image_token_id) for row in t]


def connector_labels(params):
  """"connector" for the connector's params, "frozen" for the vision encoder's and the LM's."""
  return {k: jax.tree.map(lambda _: "connector" if k == "connector" else "frozen", v) for k, v in params.items()}


def connector_mask(params):
  """True for the connector's params (an optax mask)."""
  return jax.tree.map(lambda s: s == "connector", connector_labels(params))


def connector_only(tx: optax.GradientTransformation) -> optax.GradientTransformation:
  """`tx` on the connector, zero updates (and no optimizer state) for the frozen encoder and LM.

  Only the connector's gradient is needed: `jaxlab.losses.vlm_loss_fn(cfg, freeze=True)` skips the others in the
  backward pass.
  """
  return optax.multi_transform({"connector": tx, "frozen": optax.set_to_zero()}, connector_labels)
