"""Generated scenes with ground truth, for judging LatentLens (arXiv:2602.00462) descriptions automatically.

A scene is a small RGB image on a plain, slightly noisy background (one of 6 dark colours) holding 2-4
coloured objects, each in its own cell of a 3x3 layout (rows top/middle/bottom, columns left/center/right).
Objects are drawn shapes (square, circle, triangle, ...) or, optionally, real grayscale images tinted with the
object's colour: scikit-learn's 8x8 digits (when sklearn is installed) or Fashion-MNIST (the Debian package
`dataset-fashion-mnist`, or idx files given by path); their class names then take the place of shape words.

Ground truth per ViT patch (row-major over the patch grid): the object covering the most pixels of the patch
when it covers at least `min_cover` of them, else background. `truth_words` gives the words a correct
description of that patch may use: the object's colour and shape words, or for background patches
"background" and the background's colour word.

Captions name every object in reading order: "a red circle at the top left and a blue square at the middle
right on a gray background ." `text_corpus` writes text for pretraining a text LM, mixing five styles:
captions; sentences per object in random order; notes (each object's attribute words, objects in random
order) followed by " , " and the caption; a patch grid (one attribute word per patch in raster order, the
textual counterpart of a VLM's image tokens) followed by " , " and the caption; and everyday sentences
(`GENERAL_WORDS`, where colour words modify many nouns). Styles 2 and 3 teach the LM to read attribute words
from its context and reuse them, an ability a frozen LM needs for connector-only VLM training.
`save_tokenizer` writes a word-level tokenizer.json over `vocabulary(cfg)` that `jaxlab.data.load_tokenizer`
reads.
"""
from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
from typing import Literal, NamedTuple, Sequence

import numpy as np

from jaxlab import choices

COLOURS = {"red": (0.9, 0.1, 0.1), "green": (0.1, 0.75, 0.15), "blue": (0.15, 0.3, 1.0), "yellow": (0.95, 0.9, 0.1),
           "cyan": (0.1, 0.85, 0.9), "magenta": (0.9, 0.2, 0.9), "orange": (1.0, 0.55, 0.05),
           "white": (0.97, 0.97, 0.97), "purple": (0.5, 0.1, 0.75), "pink": (1.0, 0.6, 0.75),
           "lime": (0.65, 1.0, 0.35), "teal": (0.0, 0.5, 0.5)}
BACKGROUNDS = {"black": (0.04, 0.04, 0.04), "gray": (0.45, 0.45, 0.45), "brown": (0.38, 0.24, 0.12),
               "navy": (0.05, 0.08, 0.35), "maroon": (0.4, 0.05, 0.1), "olive": (0.35, 0.35, 0.05)}
SHAPES = ("square", "circle", "triangle", "diamond", "cross", "ring", "frame", "bar")
ROWS = ("top", "middle", "bottom")
COLS = ("left", "center", "right")
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
FASHION = ("tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")
FUNCTION_WORDS = ("a", "and", "at", "the", "on", "background", "is", "there", "it", "of", ".", ",")
SPECIALS = ("<pad>", "<bos>", "<eos>", "<image>", "<unk>")
# General text (style 4): everyday sentences in which the colour words also modify many other nouns.
NOUNS = ("man", "woman", "boy", "girl", "child", "dog", "cat", "horse", "bird", "cow", "sheep", "car", "bus",
         "truck", "bike", "train", "boat", "plane", "table", "chair", "bed", "lamp", "cup", "plate", "bowl",
         "bottle", "book", "phone", "hat", "jacket", "shoe", "flower", "tree", "apple", "banana", "cake", "door",
         "window", "wall", "fence", "sign", "clock", "kite", "ball", "umbrella", "box", "basket", "towel")
ADJECTIVES = ("big", "small", "old", "young", "tall", "short", "wooden", "metal", "happy", "wet", "dry", "empty",
              "full", "dark", "bright", "shiny", "dirty", "clean", "long", "round")
VERBS = ("sits", "stands", "walks", "runs", "waits", "rests", "lies", "hangs", "leans", "stays")
PLACES = ("street", "park", "room", "kitchen", "beach", "field", "road", "city", "house", "garden", "river",
          "station", "market", "yard", "table", "shelf", "floor", "grass", "snow", "water")
PREPOSITIONS = ("in", "near", "under", "behind", "beside", "next", "to", "by", "with", "inside")
GENERAL_WORDS = NOUNS + ADJECTIVES + VERBS + PLACES + PREPOSITIONS + ("this", "that", "very", "today")
Source = Literal["shapes", "digits", "fashion_mnist"]
SOURCES = choices.values(Source)
FASHION_DIRS = ("/usr/share/dataset-fashion-mnist", "/usr/share/fashion-mnist", "/usr/share/datasets/fashion-mnist")


@dataclasses.dataclass(frozen=True)
class SceneConfig:
  """How scenes are drawn. `objects` picks drawn shapes or real images; `fashion_path` overrides the search."""
  image_size: int = 48
  patch_size: int = 12
  min_objects: int = 2
  max_objects: int = 4
  min_size: int = 14
  max_size: int = 20
  min_cover: float = 0.2
  noise: float = 0.03
  objects: Source = "shapes"
  fashion_path: str | None = None

  def __post_init__(self):
    if self.image_size % self.patch_size or self.patch_size <= 0:
      raise ValueError(f"SceneConfig: patch_size must divide image_size, found {self.patch_size}, {self.image_size}")
    if not 1 <= self.min_objects <= self.max_objects <= len(ROWS) * len(COLS):
      raise ValueError(f"SceneConfig: expected 1 <= min_objects <= max_objects <= 9, found {self.min_objects}, "
                       f"{self.max_objects}")
    if not 4 <= self.min_size <= self.max_size <= self.image_size // 2:
      raise ValueError(f"SceneConfig: expected 4 <= min_size <= max_size <= image_size/2, found {self.min_size}, "
                       f"{self.max_size}")
    if not 0 < self.min_cover <= 1:
      raise ValueError(f"SceneConfig: min_cover must be in (0, 1], found {self.min_cover}")
    choices.check(self, prefix="SceneConfig: ")

  @property
  def grid(self) -> int:
    return self.image_size // self.patch_size

  @property
  def shapes(self) -> tuple[str, ...]:
    return {"shapes": SHAPES, "digits": DIGITS, "fashion_mnist": FASHION}[self.objects]


class Obj(NamedTuple):
  colour: str
  shape: str
  row: int  # layout cell: 0 top .. 2 bottom
  col: int  # 0 left .. 2 right
  box: tuple[int, int, int]  # (y, x, size) in pixels


class Scenes(NamedTuple):
  images: np.ndarray  # [N, H, W, 3] float32 in [0, 1]
  patch_object: np.ndarray  # [N, P] index into objects[n], -1 for background
  patch_colour: np.ndarray  # [N, P] index into COLOURS, -1 for background
  patch_shape: np.ndarray  # [N, P] index into cfg.shapes, -1 for background
  background: np.ndarray  # [N] index into BACKGROUNDS
  objects: list  # per scene, list of Obj in reading order
  captions: list  # per scene, str


def shape_mask(shape: str, size: int) -> np.ndarray:
  """[size, size] bool mask of a drawn shape (pixel centres in [-1, 1], v pointing down)."""
  c = (np.arange(size) + 0.5) / size * 2 - 1
  v, u = np.meshgrid(c, c, indexing="ij")
  r, a = np.hypot(u, v), np.maximum(np.abs(u), np.abs(v))
  masks = {"square": a <= 0.85, "circle": r <= 0.92, "triangle": (np.abs(u) <= 0.5 * (v + 0.9)) & (v <= 0.9),
           "diamond": np.abs(u) + np.abs(v) <= 0.95,
           "cross": ((np.abs(u) <= 0.3) | (np.abs(v) <= 0.3)) & (a <= 0.95), "ring": (r <= 0.95) & (r >= 0.5),
           "frame": (a <= 0.9) & (a >= 0.5), "bar": (np.abs(v) <= 0.35) & (np.abs(u) <= 0.95)}
  if shape not in masks:
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
  return masks[shape]


def _resize(img, size: int) -> np.ndarray:
  """Bilinear resize of a [h, w] array in [0, 1] to [size, size]."""
  from PIL import Image
  return np.asarray(Image.fromarray(np.asarray(img, np.float32), mode="F").resize((size, size), Image.BILINEAR),
                    np.float32).clip(0, 1)


def load_digits():
  """scikit-learn's 8x8 digits: (images [N, 8, 8] in [0, 1], labels [N], class names)."""
  try:
    from sklearn.datasets import load_digits as _load
  except ImportError as e:
    raise ImportError("objects='digits' needs scikit-learn (its bundled 8x8 digits); it is not installed") from e
  d = _load()
  return d.images.astype(np.float32) / 16.0, d.target.astype(np.int64), DIGITS


def _read_idx(path: str) -> np.ndarray:
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    data = f.read()
  if len(data) < 4 or data[:2] != b"\x00\x00" or data[2] != 0x08:
    raise ValueError(f"{path}: not an idx file of unsigned bytes (magic {data[:4]!r})")
  ndim = data[3]
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
  arr = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
  if arr.size != int(np.prod(shape)):
    raise ValueError(f"{path}: header says {shape}, found {arr.size} values")
  return arr.reshape(shape)


def load_fashion_mnist(path: str | None = None, split: str = "t10k"):
  """Fashion-MNIST from idx files: (images [N, 28, 28] in [0, 1], labels [N], class names).

  Args:
    path: a directory holding `{split}-images-idx3-ubyte[.gz]` and `{split}-labels-idx1-ubyte[.gz]`; None searches
      the Debian package's directories (FASHION_DIRS).
    split: "train" or "t10k".
  """
  dirs = [path] if path else list(FASHION_DIRS)
  for d in dirs:
    imgs = sorted(glob.glob(os.path.join(d, "**", f"{split}-images-idx3-ubyte*"), recursive=True))
    labs = sorted(glob.glob(os.path.join(d, "**", f"{split}-labels-idx1-ubyte*"), recursive=True))
    if imgs and labs:
      images, labels = _read_idx(imgs[0]), _read_idx(labs[0])
      if images.ndim != 3 or labels.shape != images.shape[:1]:
        raise ValueError(f"{d}: expected images [N, h, w] and labels [N], found {images.shape}, {labels.shape}")
      return images.astype(np.float32) / 255.0, labels.astype(np.int64), FASHION
  raise FileNotFoundError(f"Fashion-MNIST idx files ({split}-images-idx3-ubyte[.gz], {split}-labels-idx1-ubyte[.gz]) "
                          f"not found under {dirs}; install the Debian package dataset-fashion-mnist or give a path")


def _sprites(cfg: SceneConfig):
  if cfg.objects == "digits":
    return load_digits()
  if cfg.objects == "fashion_mnist":
    return load_fashion_mnist(cfg.fashion_path)
  return None


def _layout(cfg: SceneConfig, n_obj: int, rng) -> list[tuple[int, int, int, int, int]]:
  """Non-overlapping (row, col, y, x, size) boxes, one object per layout cell."""
  s_img = cfg.image_size
  for _ in range(100):
    cells = rng.choice(len(ROWS) * len(COLS), size=n_obj, replace=False)
    boxes, ok = [], True
    for cell in cells:
      r, c = divmod(int(cell), len(COLS))
      size = int(rng.integers(cfg.min_size, cfg.max_size + 1))
      cy = (r + rng.uniform(0.3, 0.7)) * s_img / len(ROWS)
      cx = (c + rng.uniform(0.3, 0.7)) * s_img / len(COLS)
      y = int(np.clip(round(cy - size / 2), 0, s_img - size))
      x = int(np.clip(round(cx - size / 2), 0, s_img - size))
      if any(y < b[2] + b[4] and b[2] < y + size and x < b[3] + b[4] and b[3] < x + size for b in boxes):
        ok = False
        break
      boxes.append((r, c, y, x, size))
    if ok:
      return sorted(boxes)
  return _layout(cfg, n_obj - 1, rng) if n_obj > 1 else []


def caption(objects: Sequence[Obj], background: str) -> str:
  parts = [f"a {o.colour} {o.shape} at the {ROWS[o.row]} {COLS[o.col]}" for o in objects]
  return " and ".join(parts) + f" on a {background} background ."


def patch_owner(owner_HW: np.ndarray, cfg: SceneConfig) -> np.ndarray:
  """[P]: per patch (row-major), the object index covering most of it if >= min_cover of its pixels, else -1."""
  g, p = cfg.grid, cfg.patch_size
  n_obj = int(owner_HW.max()) + 1
  blocks = owner_HW.reshape(g, p, g, p).transpose(0, 2, 1, 3).reshape(g * g, p * p)
  if n_obj == 0:
    return np.full(g * g, -1, np.int64)
  counts = np.stack([(blocks == i).sum(-1) for i in range(n_obj)], axis=-1)
  best = counts.argmax(-1)
  return np.where(counts.max(-1) >= cfg.min_cover * p * p, best, -1).astype(np.int64)


def generate(n: int, cfg: SceneConfig = SceneConfig(), seed: int = 0) -> Scenes:
  """`n` scenes, deterministic in (cfg, seed)."""
  rng = np.random.default_rng(seed)
  sprites = _sprites(cfg)
  s, colours, bgs = cfg.image_size, list(COLOURS), list(BACKGROUNDS)
  images = np.zeros((n, s, s, 3), np.float32)
  p_obj = np.full((n, cfg.grid ** 2), -1, np.int64)
  p_col, p_shape = p_obj.copy(), p_obj.copy()
  background = rng.integers(0, len(bgs), size=n)
  all_objects, captions = [], []
  for i in range(n):
    bg = np.asarray(BACKGROUNDS[bgs[background[i]]], np.float32)
    img = np.broadcast_to(bg, (s, s, 3)).copy()
    owner = np.full((s, s), -1, np.int64)
    objs = []
    for j, (r, c, y, x, size) in enumerate(_layout(cfg, int(rng.integers(cfg.min_objects, cfg.max_objects + 1)),
                                                   rng)):
      colour = colours[int(rng.integers(len(colours)))]
      rgb = np.clip(np.asarray(COLOURS[colour], np.float32) + rng.uniform(-0.05, 0.05, 3), 0, 1)
      if sprites is None:
        k = int(rng.integers(len(SHAPES)))
        alpha = shape_mask(SHAPES[k], size).astype(np.float32)
      else:
        m = int(rng.integers(len(sprites[1])))
        k = int(sprites[1][m])
        alpha = _resize(sprites[0][m], size)
      mask = alpha > 0.3
      patch = img[y:y + size, x:x + size]
      img[y:y + size, x:x + size] = patch * (1 - alpha[..., None]) + rgb * alpha[..., None]
      owner[y:y + size, x:x + size][mask] = j
      objs.append(Obj(colour, cfg.shapes[k], r, c, (y, x, size)))
    img = img + rng.normal(0, cfg.noise, img.shape).astype(np.float32)
    images[i] = np.clip(img, 0, 1)
    po = patch_owner(owner, cfg)
    p_obj[i] = po
    for j, o in enumerate(objs):
      p_col[i][po == j] = colours.index(o.colour)
      p_shape[i][po == j] = cfg.shapes.index(o.shape)
    all_objects.append(objs)
    captions.append(caption(objs, bgs[background[i]]))
  return Scenes(images, p_obj, p_col, p_shape, background, all_objects, captions)


def truth_words(scenes: Scenes, i: int, patch: int) -> frozenset:
  """Words that correctly describe patch `patch` of scene `i`: its object's colour and shape, or for a
  background patch "background" and the background's colour."""
  j = int(scenes.patch_object[i, patch])
  if j < 0:
    return frozenset({"background", list(BACKGROUNDS)[int(scenes.background[i])]})
  o = scenes.objects[i][j]
  return frozenset({o.colour, o.shape})


def vocabulary(cfg: SceneConfig = SceneConfig()) -> list[str]:
  """Special tokens, then every word captions and `text_corpus` use."""
  words = FUNCTION_WORDS + tuple(COLOURS) + tuple(BACKGROUNDS) + cfg.shapes + ROWS + COLS + GENERAL_WORDS
  return list(SPECIALS) + sorted(set(words) - set(SPECIALS), key=words.index)


def _random_objects(cfg: SceneConfig, rng) -> tuple[list[Obj], str]:
  n_obj = int(rng.integers(cfg.min_objects, cfg.max_objects + 1))
  cells = sorted(rng.choice(len(ROWS) * len(COLS), size=n_obj, replace=False))
  objs = [Obj(list(COLOURS)[int(rng.integers(len(COLOURS)))], cfg.shapes[int(rng.integers(len(cfg.shapes)))],
              int(c) // len(COLS), int(c) % len(COLS), (0, 0, 0)) for c in cells]
  return objs, list(BACKGROUNDS)[int(rng.integers(len(BACKGROUNDS)))]


def describe(objects: Sequence[Obj], background: str, style: int, rng) -> str:
  """One caption-like text about the objects. style 0: the caption; 1: sentences per object in random order;
  2: notes (each object's colour, shape, row and column words; objects in random order), then the caption."""
  if style == 0:
    return caption(objects, background)
  if style == 1:
    sents = [f"there is a {o.colour} {o.shape} at the {ROWS[o.row]} {COLS[o.col]} ." if rng.random() < 0.5 else
             f"the {o.shape} at the {ROWS[o.row]} {COLS[o.col]} is {o.colour} ." for o in objects]
    sents.append(f"the background is {background} .")
    return " ".join(sents[k] for k in rng.permutation(len(sents)))
  if style == 2:
    chunks = [[o.colour, o.shape, ROWS[o.row], COLS[o.col]] for o in objects] + [[background, "background"]]
    words = [w for k in rng.permutation(len(chunks)) for w in chunks[k]]
    return " ".join(words) + " , " + caption(objects, background)
  raise ValueError(f"describe: style must be 0, 1 or 2 (3 needs a drawn scene: grid_text), found {style}")


def grid_text(scenes: Scenes, i: int, rng) -> str:
  """Style 3: one word per patch in raster order (the colour or shape of its object, or for background
  "background" or the background's colour, each chosen at random), then the caption."""
  words = [sorted(truth_words(scenes, i, p))[int(rng.integers(2))] for p in range(scenes.patch_object.shape[1])]
  return " ".join(words) + " , " + scenes.captions[i]


def _noun_phrase(rng, det: str = "a") -> str:
  words = [det]
  if rng.random() < 0.3:
    words.append(ADJECTIVES[int(rng.integers(len(ADJECTIVES)))])
  if rng.random() < 0.6:
    colours = tuple(COLOURS) + tuple(BACKGROUNDS)
    words.append(colours[int(rng.integers(len(colours)))])
  words.append(NOUNS[int(rng.integers(len(NOUNS)))])
  return " ".join(words)


def general_text(rng) -> str:
  """Style 4: an everyday sentence (GENERAL_WORDS) in which colour words modify many nouns, not only shapes."""
  pick = lambda ws: ws[int(rng.integers(len(ws)))]
  place = f"the {pick(PLACES)}"
  kind = int(rng.integers(4))
  if kind == 0:
    return f"{_noun_phrase(rng)} {pick(VERBS)} {pick(PREPOSITIONS)} {place} ."
  if kind == 1:
    return f"{_noun_phrase(rng, 'the')} {pick(PREPOSITIONS)} {place} is {pick(tuple(COLOURS) + ADJECTIVES)} ."
  if kind == 2:
    return f"there is {_noun_phrase(rng)} and {_noun_phrase(rng)} {pick(PREPOSITIONS)} {place} ."
  return f"{pick(('this', 'that'))} {pick(NOUNS)} is very {pick(ADJECTIVES)} today ."


def text_corpus(n: int, cfg: SceneConfig = SceneConfig(), seed: int = 0,
                styles: Sequence[float] = (0.4, 0.3, 0.3, 0.0, 0.0)) -> list[str]:
  """`n` caption-like texts; `styles` weighs `describe`'s styles 0-2, `grid_text` (3: draws the scenes) and
  `general_text` (4); four weights leave out style 4."""
  rng = np.random.default_rng(seed)
  w = np.asarray(styles, np.float64)
  if w.shape == (4,):
    w = np.append(w, 0.0)
  if w.shape != (5,) or (w < 0).any() or w.sum() <= 0:
    raise ValueError(f"styles must be 4 or 5 non-negative weights, found {styles}")
  picks = rng.choice(5, size=n, p=w / w.sum())
  grid = generate(int((picks == 3).sum()), cfg, seed=seed + 1) if (picks == 3).any() else None
  out, g = [], 0
  for style in picks:
    if style == 3:
      out.append(grid_text(grid, g, rng))
      g += 1
    elif style == 4:
      out.append(general_text(rng))
    else:
      objs, bg = _random_objects(cfg, rng)
      out.append(describe(objs, bg, int(style), rng))
  return out


def save_tokenizer(path: str, words: Sequence[str]) -> str:
  """Writes a word-level (whitespace split) tokenizer.json and tokenizer_config.json; returns the directory.
  `words` must start with SPECIALS (as `vocabulary` does)."""
  if tuple(words[:len(SPECIALS)]) != SPECIALS or len(set(words)) != len(words):
    raise ValueError(f"words must be distinct and start with {SPECIALS}, found {list(words[:len(SPECIALS)])}")
  os.makedirs(path, exist_ok=True)
  added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
            "special": True} for i, t in enumerate(SPECIALS)]
  tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
         "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
         "model": {"type": "WordLevel", "vocab": {w: i for i, w in enumerate(words)}, "unk_token": "<unk>"}}
  with open(os.path.join(path, "tokenizer.json"), "w") as f:
    json.dump(tok, f, indent=1)
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
               "image_token": "<image>"}, f, indent=1)
  return path
