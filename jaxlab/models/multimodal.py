"""Multimodal LMs: the features of any encoder enter a decoder LM, spliced at placeholder tokens or as a prefix.

Splice (LLaVA, arXiv 2304.08485): the token sequence holds `n_tokens` copies of a placeholder id per encoder
input; their embeddings are replaced by the connected features in order (row-major over the batch, inputs in
order), as transformers' LLaVA does (`masked_scatter`). Prefix (the Q-Former latents of BLIP-2, arXiv
2301.12597): K latents per row (learned queries, one encoder input's features, or both) are prepended to the
text embeddings; the attention mask gains K ones and positions count on from the latents. The connector is the
2-layer MLP of LLaVA-1.5 (arXiv 2310.03744). The LM is `jaxlab.models.transformer` run on the combined
embeddings, so captures, interventions and layer programs work unchanged.

An encoder is anything mapping a batch of inputs to features [B, N, E] (`Encoder`, functions of its own frozen
config): `VIT` (the hidden states of chosen ViT layers, as LLaVA selects them), `WHISPER` (Whisper's encoder
output over a log-mel window, mean-pooled in time to a few dozen tokens) and `LINEAR` (one linear map per item:
video frames, points or audio windows given as feature vectors). A frozen encoder's features may be computed
once and passed to `forward`/`embed` as `features_BNE`, skipping the encoder.

Axes: B batch (LM rows; for features, the encoder's inputs, whose count need not be the LM's), T positions,
N feature tokens per input, K prefix latents, E encoder width, F connector width, D LM width, X item width.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from jaxlab import choices
from jaxlab.models import transformer as tfm
from jaxlab.models import vit
from jaxlab.models import whisper
from jaxlab.nn import axes, layers

Mode = Literal["splice", "prefix"]
MODES = choices.values(Mode)
FeatureSelect = Literal["default", "full"]  # "default": drop the first (class) token; "full": keep every token


class Encoder(NamedTuple):
  """An encoder `Config` can use: pure functions of the encoder's own (frozen, hashable) config `c`."""
  init: Callable[[Any, Any], dict]  # init(c, key) -> params
  forward: Callable[[Any, Any, Any], Any]  # forward(params, inputs, c) -> features [B, N, E]
  width: Callable[[Any], int]  # E
  n_tokens: Callable[[Any], int]  # N
  axes: axes.Rules  # logical axes of init's params


@dataclasses.dataclass(frozen=True)
class VitFeatures:
  """ViT features as LLaVA selects them: the hidden states of `feature_layers` (HF indexing: 0 = embeddings,
  -1 = last block; several are concatenated on the feature axis), the first (class) token dropped with
  `feature_select="default"` or kept with "full"."""
  vision: vit.Config = vit.PRESETS["clip-tiny"]
  feature_layers: tuple[int, ...] = (-2,)
  feature_select: FeatureSelect = "default"

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"multimodal.VitFeatures: {msg}")
    if isinstance(self.feature_layers, int):
      object.__setattr__(self, "feature_layers", (self.feature_layers,))
    object.__setattr__(self, "feature_layers", tuple(int(x) for x in self.feature_layers))
    n = self.vision.n_layers
    if not self.feature_layers or any(not -(n + 1) <= x <= n for x in self.feature_layers):
      bad(f"feature_layers must be non-empty HF hidden-state indices in [{-(n + 1)}, {n}], found "
          f"{self.feature_layers}")
    choices.check(self, bad, nested=False)
    if self.feature_select == "default" and not self.vision.cls_token:
      bad("feature_select='default' drops the class token, but the vision encoder has none; use 'full'")

  @property
  def width(self) -> int:
    return self.vision.d_model * len(self.feature_layers)

  @property
  def n_tokens(self) -> int:
    return self.vision.seq_len - (1 if self.feature_select == "default" else 0)

  @property
  def layers_used(self) -> int:
    """Blocks the encoder must run to produce every feature layer."""
    return max(x % (self.vision.n_layers + 1) for x in self.feature_layers)


def vit_features(params, pixels_BHWC, c: VitFeatures):
  """[B, N, E]: the selected hidden states of the ViT on the images."""
  out = vit.forward(params, pixels_BHWC, c.vision, capture=("hidden_states",), n_layers=c.layers_used)
  n_hs = c.vision.n_layers + 1
  feats = [out.hidden_states[x % n_hs] for x in c.feature_layers]
  if c.feature_select == "default":
    feats = [f[:, 1:] for f in feats]
  return jnp.concatenate(feats, axis=-1)


VIT = Encoder(init=lambda c, key: vit.init(c.vision, key), forward=vit_features, width=lambda c: c.width,
              n_tokens=lambda c: c.n_tokens, axes=vit.AXES)


@dataclasses.dataclass(frozen=True)
class WhisperFeatures:
  """Whisper's encoder output (arXiv 2212.04356) over one 30 s log-mel window [n_mels, 2A], its first
  `n_tokens * pool` positions (20 ms each) mean-pooled in groups of `pool`: `n_tokens` features of width d_model.
  The default keeps the first 12.8 s at 4 tokens per second."""
  whisper: whisper.Config = whisper.PRESETS["tiny_random"]
  n_tokens: int = 4
  pool: int = 4

  def __post_init__(self):
    if self.n_tokens <= 0 or self.pool <= 0 or self.n_tokens * self.pool > self.whisper.max_source_positions:
      raise ValueError(f"multimodal.WhisperFeatures: n_tokens * pool must be in [1, "
                       f"{self.whisper.max_source_positions}] (encoder positions), found {self.n_tokens} * {self.pool}")


def whisper_features(params, mel_BFT, c: WhisperFeatures):
  """[B, N, E]: the pooled Whisper encoder output."""
  enc_BAE = whisper.encode(params, mel_BFT, c.whisper)[:, :c.n_tokens * c.pool]
  return enc_BAE.reshape(enc_BAE.shape[0], c.n_tokens, c.pool, -1).mean(axis=2)


WHISPER = Encoder(init=lambda c, key: {"encoder": whisper.init(c.whisper, key)["encoder"]},
                  forward=whisper_features, width=lambda c: c.whisper.d_model, n_tokens=lambda c: c.n_tokens,
                  axes=whisper.AXES)


@dataclasses.dataclass(frozen=True)
class LinearFeatures:
  """`n_tokens` items of width `d_in` per input (frames, points, audio windows), each mapped to `width`."""
  d_in: int = 8
  width: int = 32
  n_tokens: int = 4
  bias: bool = True
  init_std: float = 0.02
  param_dtype: layers.DType = "float32"
  dtype: layers.DType = "float32"

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"multimodal.LinearFeatures: {msg}")
    for name in ("d_in", "width", "n_tokens"):
      if getattr(self, name) <= 0:
        bad(f"{name} must be positive, found {getattr(self, name)}")
    layers.check_dtype_names(self, bad)


def linear_features(params, items_BNX, c: LinearFeatures):
  """[B, N, E]: every item through one linear map."""
  if tuple(items_BNX.shape[1:]) != (c.n_tokens, c.d_in):
    raise ValueError(f"inputs must be [B, {c.n_tokens}, {c.d_in}], found {tuple(items_BNX.shape)}")
  return layers.linear(params["proj"], items_BNX, jnp.dtype(c.dtype))


LINEAR = Encoder(
    init=lambda c, key: {"proj": layers.linear_init(key, c.d_in, c.width, bias=c.bias, std=c.init_std,
                                                    dtype=jnp.dtype(c.param_dtype))},
    forward=linear_features, width=lambda c: c.width, n_tokens=lambda c: c.n_tokens,
    axes=axes.rules((r"proj/kernel", ("patch", "embed"), "patch"),  # item features in, like patch pixels
                    (r"proj/bias", ("embed",), None)))


@dataclasses.dataclass(frozen=True)
class Config:
  encoder: Encoder = VIT
  encoder_cfg: Any = VitFeatures()
  text: tfm.Config = tfm.PRESETS["tiny"]
  mode: Mode = "splice"  # "splice": features replace placeholder tokens; "prefix": prepended latents
  placeholder_id: int = 3  # splice: the token id whose positions receive the features
  n_latents: int = 0  # prefix: learned latents prepended ahead of the encoder's (Q-Former queries)
  connector_hidden: int | None = None  # None: the LM width (LLaVA)
  connector_activation: layers.Activation = "gelu"
  connector_bias: bool = True
  modality: str = "input"  # what one encoder input is, in error messages ("image")

  def __post_init__(self):
    def bad(msg):
      raise ValueError(f"multimodal.Config: {msg}")
    if not isinstance(self.encoder, Encoder):
      bad(f"encoder must be a multimodal.Encoder, found {type(self.encoder).__name__}")
    choices.check(self, bad, nested=False)
    if self.mode == "splice" and not 0 <= self.placeholder_id < self.text.vocab_size:
      bad(f"placeholder_id must be in [0, {self.text.vocab_size}), found {self.placeholder_id}")
    if self.n_latents < 0 or (self.n_latents and self.mode != "prefix"):
      bad(f"n_latents must be >= 0, and 0 unless mode='prefix'; found {self.n_latents} with mode={self.mode!r}")
    if self.connector_hidden is not None and self.connector_hidden <= 0:
      bad(f"connector_hidden must be positive, found {self.connector_hidden}")

  @property
  def connector_dim(self) -> int:
    return self.connector_hidden or self.text.d_model

  @property
  def tokens_per_input(self) -> int:
    return self.encoder.n_tokens(self.encoder_cfg)

  def replace(self, **kw) -> "Config":
    return dataclasses.replace(self, **kw)


# Logical axes of the LM and the connector (and latents); `axis_rules(cfg)` adds the encoder's.
AXES = tfm.AXES + axes.rules(
    (r"connector/fc1/kernel", ("embed", "mlp"), "embed"),
    (r"connector/fc1/bias", ("mlp",), None),
    (r"connector/fc2/kernel", ("mlp", "embed"), "mlp"),
    (r"connector/fc2/bias", ("embed",), None),
    (r"latents", ("pos", "embed"), "pos"),  # learned queries, a lookup table like a position embedding
)


def axis_rules(cfg: Config) -> axes.Rules:
  """Logical axes of `init(cfg, key)`'s params: the encoder's, then the LM's and the connector's."""
  return cfg.encoder.axes + AXES


def connector_init(keys, d_in: int, d_hidden: int, d_out: int, *, bias: bool, std: float, dtype) -> dict:
  """{"fc1": [E, F], "fc2": [F, D]} linears from the key pair `keys`."""
  k1, k2 = keys
  return {"fc1": layers.linear_init(k1, d_in, d_hidden, bias=bias, std=std, dtype=dtype),
          "fc2": layers.linear_init(k2, d_hidden, d_out, bias=bias, std=std, dtype=dtype)}


def connector(params, features_BNE, activation: str, dtype):
  """LLaVA-1.5's projector: fc2(act(fc1(x)))."""
  h = layers.ACTIVATIONS[activation](layers.linear(params["fc1"], features_BNE, dtype))
  return layers.linear(params["fc2"], h, dtype)


def init(cfg: Config, key) -> dict:
  """{"encoder": the encoder's params, "connector": {"fc1", "fc2"}, "lm": transformer params[, "latents"]}."""
  ke, kc1, kc2, kl = jax.random.split(key, 4)
  dt = jnp.dtype(cfg.text.param_dtype)
  e = cfg.encoder.width(cfg.encoder_cfg)
  params = {"encoder": cfg.encoder.init(cfg.encoder_cfg, ke),
            "connector": connector_init((kc1, kc2), e, cfg.connector_dim, cfg.text.d_model, bias=cfg.connector_bias,
                                        std=cfg.text.init_std, dtype=dt),
            "lm": tfm.init(cfg.text, kl)}
  if cfg.n_latents:
    params["latents"] = layers.normal(jax.random.fold_in(key, 4), (cfg.n_latents, cfg.text.d_model),
                                      cfg.text.init_std, dt)
  return params


def encode(params, inputs, cfg: Config):
  """The encoder's features in the LM's embedding space: [B, N, D]."""
  f = cfg.encoder.forward(params["encoder"], inputs, cfg.encoder_cfg)
  return connector(params["connector"], f, cfg.connector_activation, jnp.dtype(cfg.text.dtype))


def scatter(embeds_BTD, mask_BT, features_BND):
  """Replaces the masked positions' embeddings by the features, in row-major order (transformers' masked_scatter)."""
  flat = features_BND.reshape(-1, features_BND.shape[-1]).astype(embeds_BTD.dtype)
  idx = jnp.cumsum(mask_BT.reshape(-1)) - 1
  picked = jnp.take(flat, jnp.clip(idx, 0, flat.shape[0] - 1), axis=0).reshape(embeds_BTD.shape)
  return jnp.where(mask_BT[..., None], picked, embeds_BTD)


def splice(embeds_BTD, tokens_BT, features_BND, placeholder_id: int):
  """`scatter` at the positions holding `placeholder_id`: all of input 0's tokens first, then input 1's, ..."""
  return scatter(embeds_BTD, jnp.asarray(tokens_BT) == placeholder_id, features_BND)


class Prefixed(NamedTuple):
  embeds_BTD: Any  # [B, K+T, D]
  mask_BT: Any  # [B, K+T] int32: 1 on the latents and the real tokens
  positions_BT: Any = None  # [B, K+T]: latents 0..K-1, the given positions shifted by K (None: none given)


def prefix(embeds_BTD, latents_BKD, mask_BT=None, positions_BT=None) -> Prefixed:
  """Prepends K latents to every row; the LM run on the result is the LM run on the concatenated embeddings.

  Args:
    mask_BT: 1 on real tokens, 0 on padding (None: all real); the latents are always attended.
    positions_BT: the text's positions, or None for the LM's default (the count of attended tokens before).
  """
  b, t = embeds_BTD.shape[:2]
  k = latents_BKD.shape[1]
  if latents_BKD.shape[0] != b:
    raise ValueError(f"latents must be [B={b}, K, D], found {tuple(latents_BKD.shape)}")
  x = jnp.concatenate([latents_BKD.astype(embeds_BTD.dtype), embeds_BTD], axis=1)
  m = jnp.ones((b, t), jnp.int32) if mask_BT is None else jnp.asarray(mask_BT).astype(jnp.int32)
  m = jnp.concatenate([jnp.ones((b, k), jnp.int32), m], axis=1)
  pos = None
  if positions_BT is not None:
    pos = jnp.concatenate([jnp.broadcast_to(jnp.arange(k), (b, k)), jnp.asarray(positions_BT) + k], axis=1)
  return Prefixed(x, m, pos)


class Output(NamedTuple):
  lm: tfm.Output  # the decoder's output over the whole sequence (prefix included)
  feature_mask_BT: Any  # [B, T] bool over the LM's sequence: positions holding encoder features or latents
  features: Any = None  # [B, N, D] connector outputs (None without inputs)
  n_prefix: int = 0  # latents prepended (prefix mode): the text's logits are logits[:, n_prefix:]

  @property
  def logits(self):
    return self.lm.logits


def _check_count(mask_BT, n_inputs: int, cfg: Config):
  if isinstance(mask_BT, jax.core.Tracer):
    return
  per, have = cfg.tokens_per_input, int(mask_BT.sum())
  if have != n_inputs * per:
    raise ValueError(f"{n_inputs} {cfg.modality}s need {n_inputs * per} {cfg.modality} tokens ({per} each, id "
                     f"{cfg.placeholder_id}); the tokens hold {have}")


def _connected(params, inputs, features_BNE, cfg: Config):
  if features_BNE is None:
    return encode(params, inputs, cfg)
  return connector(params["connector"], features_BNE, cfg.connector_activation, jnp.dtype(cfg.text.dtype))


def _spliced(params, tokens_BT, inputs, features_BNE, cfg: Config):
  """Splice mode's LM input [B, T, D], its placeholder mask [B, T] and the connected features (None without
  inputs)."""
  x = layers.embed(params["lm"]["embed"], tokens_BT, jnp.dtype(cfg.text.dtype))
  mask = tokens_BT == cfg.placeholder_id
  if inputs is None and features_BNE is None:
    return x, mask, None
  n = (features_BNE if features_BNE is not None else jax.tree.leaves(inputs)[0]).shape[0]
  _check_count(mask, n, cfg)
  feats = _connected(params, inputs, features_BNE, cfg)
  return scatter(x, mask, feats), mask, feats


def embed(params, tokens_BT, inputs, cfg: Config, *, features_BNE=None):
  """Splice mode's LM input [B, T, D]: the token embeddings with the connected features at the placeholders
  (the prompt embeddings `generate.sample(..., inputs_embeds_BTD=)` decodes from).

  Args:
    inputs: the encoder's batch, or None.
    features_BNE: the encoder's features computed beforehand, in place of `inputs`.
  """
  if cfg.mode != "splice":
    raise ValueError(f"embed builds splice-mode inputs; this config's mode is {cfg.mode!r}")
  return _spliced(params, jnp.asarray(tokens_BT), inputs, features_BNE, cfg)[0]


def forward(params, tokens_BT, inputs, cfg: Config, *, attention_mask_BT=None, positions_BT=None,
            capture: Sequence[str] = (), intervention: tfm.Intervention | None = None,
            program: Sequence[int] | None = None, features_BNE=None) -> Output:
  """Runs the multimodal LM.

  Args:
    tokens_BT: token ids; in splice mode `tokens_per_input` placeholders per input (row 0's inputs first).
    inputs: the encoder's batch (splice: any count; prefix: one per row), or None for text (and learned
      latents) only.
    attention_mask_BT, positions_BT: of the text, as in `transformer.forward`; prefix mode extends them.
    capture, intervention, program: as in `transformer.forward`, over the whole sequence.
    features_BNE: a frozen encoder's features computed beforehand, in place of `inputs` (the encoder is
      skipped; its params may be absent).
  """
  tokens_BT = jnp.asarray(tokens_BT)
  if cfg.mode == "splice":
    x, mask, feats = _spliced(params, tokens_BT, inputs, features_BNE, cfg)
    out = tfm.forward(params["lm"], tokens_BT, cfg.text, inputs_embeds_BTD=x, attention_mask_BT=attention_mask_BT,
                      positions_BT=positions_BT, capture=capture, intervention=intervention, program=program)
    return Output(lm=out, feature_mask_BT=mask, features=feats)
  x = layers.embed(params["lm"]["embed"], tokens_BT, jnp.dtype(cfg.text.dtype))
  b, feats = tokens_BT.shape[0], None
  latents = []
  if cfg.n_latents:
    latents.append(jnp.broadcast_to(params["latents"][None], (b,) + params["latents"].shape))
  if inputs is not None or features_BNE is not None:
    feats = _connected(params, inputs, features_BNE, cfg)
    latents.append(feats)
  if not latents:
    raise ValueError("prefix mode needs inputs or learned latents (n_latents > 0); found neither")
  lat = jnp.concatenate(latents, axis=1) if len(latents) > 1 else latents[0]
  k = lat.shape[1]
  pre = prefix(x, lat, attention_mask_BT, positions_BT)
  toks = jnp.pad(tokens_BT, ((0, 0), (k, 0)))  # unused under inputs_embeds_BTD; keeps the [B, K+T] shape
  out = tfm.forward(params["lm"], toks, cfg.text, inputs_embeds_BTD=pre.embeds_BTD, attention_mask_BT=pre.mask_BT,
                    positions_BT=pre.positions_BT, capture=capture, intervention=intervention, program=program)
  mask = jnp.broadcast_to(jnp.arange(k + tokens_BT.shape[1]) < k, toks.shape)
  return Output(lm=out, feature_mask_BT=mask, features=feats, n_prefix=k)
