"""jaxlab.data.tasks.scenes: ground truth checked against the pixels (nearest palette colour, box geometry), the
patch owner against a brute-force count, shape areas against closed forms, the tokenizer round trip, the idx
reader."""
import gzip
import itertools
import math

import numpy as np
import pytest

from jaxlab.data import load_tokenizer
from jaxlab.data.tasks import scenes as S

CLEAN = S.SceneConfig(noise=0.0)


@pytest.fixture(scope="module")
def clean():
  return S.generate(48, CLEAN, seed=3)


def test_deterministic_in_seed():
  a, b, c = S.generate(5, seed=1), S.generate(5, seed=1), S.generate(5, seed=2)
  np.testing.assert_array_equal(a.images, b.images)
  assert a.captions == b.captions and a.captions != c.captions
  assert a.images.shape == (5, 48, 48, 3) and a.images.min() >= 0 and a.images.max() <= 1


@pytest.mark.parametrize("shape,area", [("square", 0.85 ** 2), ("circle", math.pi * 0.92 ** 2 / 4),
                                        ("diamond", 2 * 0.95 ** 2 / 4), ("ring", math.pi * (0.95 ** 2 - 0.5 ** 2) / 4),
                                        ("bar", 0.35 * 0.95)])
def test_shape_areas_match_closed_forms(shape, area):
  assert abs(S.shape_mask(shape, 400).mean() - area) < 0.01


def test_patch_owner_matches_brute_force():
  rng = np.random.default_rng(0)
  cfg = S.SceneConfig(min_cover=0.3)
  for _ in range(20):
    owner = rng.integers(-1, 3, size=(48, 48))
    got = S.patch_owner(owner, cfg)
    for p in range(16):
      r, c = divmod(p, 4)
      block = owner[12 * r:12 * r + 12, 12 * c:12 * c + 12].ravel()
      counts = [int((block == j).sum()) for j in range(int(owner.max()) + 1)]
      best = int(np.argmax(counts))
      assert got[p] == (best if counts[best] >= 0.3 * 144 else -1)


def _nearest(palette, rgb):
  names = list(palette)
  return names[int(np.argmin([np.abs(np.asarray(palette[n]) - rgb).max() for n in names]))]


def test_captions_and_objects_agree_with_pixels(clean):
  for i, objs in enumerate(clean.objects):
    bg = list(S.BACKGROUNDS)[clean.background[i]]
    assert _nearest(S.BACKGROUNDS, clean.images[i, 0, 0]) == bg or any(
        o.box[0] == 0 and o.box[1] == 0 for o in objs)
    words = clean.captions[i].split()
    assert words[-3:-1] == [bg, "background"]
    cells = set()
    for o in objs:
      y, x, s = o.box
      assert f"a {o.colour} {o.shape} at the {S.ROWS[o.row]} {S.COLS[o.col]}" in clean.captions[i]
      assert (int((y + s / 2) / 48 * 3), int((x + s / 2) / 48 * 3)) == (o.row, o.col)  # centre in the named cell
      cells.add((o.row, o.col))
      fg = clean.images[i, y:y + s, x:x + s].reshape(-1, 3)
      fg = fg[np.abs(fg - np.asarray(S.BACKGROUNDS[bg])).max(-1) > 0.02]
      assert _nearest(S.COLOURS, np.median(fg, 0)) == o.colour
    assert len(cells) == len(objs)
    assert [(o.row, o.col) for o in objs] == sorted((o.row, o.col) for o in objs)  # reading order


def test_patch_labels_match_painted_pixels(clean):
  cfg = CLEAN
  for i, objs in enumerate(clean.objects):
    bg = np.asarray(S.BACKGROUNDS[list(S.BACKGROUNDS)[clean.background[i]]])
    painted = np.full((48, 48), -1)
    for j, o in enumerate(objs):
      y, x, s = o.box
      region = clean.images[i, y:y + s, x:x + s]
      painted[y:y + s, x:x + s][np.abs(region - bg).max(-1) > 0.02] = j
    for p in range(16):
      r, c = divmod(p, 4)
      block = painted[12 * r:12 * r + 12, 12 * c:12 * c + 12]
      counts = [int((block == j).sum()) for j in range(len(objs))]
      want = int(np.argmax(counts)) if counts and max(counts) >= cfg.min_cover * 144 else -1
      assert clean.patch_object[i, p] == want
      truth = S.truth_words(clean, i, p)
      if want < 0:
        assert clean.patch_colour[i, p] == clean.patch_shape[i, p] == -1
        assert truth == {"background", list(S.BACKGROUNDS)[clean.background[i]]}
      else:
        o = objs[want]
        assert list(S.COLOURS)[clean.patch_colour[i, p]] == o.colour
        assert S.SHAPES[clean.patch_shape[i, p]] == o.shape
        assert truth == {o.colour, o.shape}


def test_objects_patches_are_common(clean):
  share = (clean.patch_object >= 0).mean()
  assert 0.25 < share < 0.6
  assert all(2 <= len(o) <= 4 for o in clean.objects)


def test_tokenizer_round_trip_and_closed_vocabulary(tmp_path):
  words = S.vocabulary()
  tok = load_tokenizer(S.save_tokenizer(str(tmp_path), words))
  assert tok.vocab_size == len(words) and tok.bos_id == 1 and tok.eos_id == 2 and tok.pad_id == 0
  texts = S.text_corpus(300, seed=5, styles=(1, 1, 1, 1, 1)) + S.generate(10, seed=5).captions
  unk = words.index("<unk>")
  for t in texts:
    ids = tok.encode(t)
    assert unk not in ids and ids == [words.index(w) for w in t.split()]
    assert tok.decode(ids) == t
  assert tok.decode([3], skip_special=False) == "<image>"
  with pytest.raises(ValueError, match="start with"):
    S.save_tokenizer(str(tmp_path / "bad"), ["a", "b"])


def test_text_corpus_styles():
  only_captions = S.text_corpus(20, seed=1, styles=(1, 0, 0, 0))
  assert all(t.startswith("a ") and t.endswith("background .") for t in only_captions)
  for t in S.text_corpus(20, seed=1, styles=(0, 0, 1, 0)):
    notes, caption = t.split(" , ", 1)
    chunks = [c.split(" at the ") for c in caption[:-len(" background .")].split(" on a ")[0].split(" and ")]
    want = sorted(" ".join([c[0].split()[1], c[0].split()[2], c[1]]) for c in chunks)
    words = notes.split()
    got = []
    while words:
      if words[1] == "background":
        words = words[2:]
        continue
      got.append(" ".join(words[:4]))
      words = words[4:]
    assert sorted(got) == want  # the notes hold exactly the caption's objects
  with pytest.raises(ValueError, match="styles"):
    S.text_corpus(2, styles=(1, -1, 0, 0))
  with pytest.raises(ValueError, match="styles"):
    S.text_corpus(2, styles=(1, 0, 0))
  assert S.text_corpus(30, seed=3, styles=(1, 1, 1, 0)) == S.text_corpus(30, seed=3, styles=(1, 1, 1, 0, 0))


def test_general_text_uses_colours_with_everyday_nouns_and_no_attribute_nouns():
  texts = S.text_corpus(400, seed=2, styles=(0, 0, 0, 0, 1))
  words = [w for t in texts for w in t.split()]
  attribute = set(S.SHAPES + S.DIGITS + S.FASHION + S.ROWS + S.COLS)
  assert not attribute & set(words)  # everyday text never names a scene shape or position
  assert set(words) <= set(S.vocabulary()) and not set(S.GENERAL_WORDS) & attribute
  after_colour = {b for t in texts for a, b in zip(t.split(), t.split()[1:]) if a in S.COLOURS}
  assert len(after_colour & set(S.NOUNS)) >= 30  # a colour word is followed by many different nouns


def test_grid_text_names_each_patch_in_raster_order():
  texts = S.text_corpus(30, seed=4, styles=(0, 0, 0, 1))
  scenes = S.generate(30, seed=5)  # text_corpus draws its grid scenes with seed + 1
  for i, t in enumerate(texts):
    grid, caption = t.split(" , ", 1)
    words = grid.split()
    assert caption == scenes.captions[i] and len(words) == 16
    assert all(w in S.truth_words(scenes, i, p) for p, w in enumerate(words))


def _write_idx(path, arr):
  arr = np.asarray(arr, np.uint8)
  head = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
  with gzip.open(path, "wb") as f:
    f.write(head + arr.tobytes())


def test_fashion_mnist_idx_reader_and_real_object_scenes(tmp_path):
  rng = np.random.default_rng(0)
  imgs = np.zeros((6, 28, 28), np.uint8)
  imgs[:, 6:22, 6:22] = rng.integers(150, 256, size=(6, 16, 16))
  labels = np.arange(6) % 10
  _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", imgs)
  _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", labels)
  x, y, names = S.load_fashion_mnist(str(tmp_path))
  np.testing.assert_allclose(x, imgs / 255.0, rtol=1e-6)
  np.testing.assert_array_equal(y, labels)
  assert names == S.FASHION
  cfg = S.SceneConfig(objects="fashion_mnist", fashion_path=str(tmp_path))
  sc = S.generate(4, cfg, seed=0)
  used = {o.shape for objs in sc.objects for o in objs}
  assert used <= set(S.FASHION[:6]) and used
  assert set(S.FASHION) <= set(S.vocabulary(cfg))
  with open(tmp_path / "bad-images-idx3-ubyte", "wb") as f:
    f.write(b"\x01\x02\x03\x04")
  with pytest.raises(ValueError, match="idx"):
    S._read_idx(str(tmp_path / "bad-images-idx3-ubyte"))
  with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
    S.load_fashion_mnist(str(tmp_path / "nowhere"))


def test_digits_need_sklearn():
  try:
    import sklearn  # noqa: F401
  except ImportError:
    with pytest.raises(ImportError, match="scikit-learn"):
      S.generate(1, S.SceneConfig(objects="digits"))
    return
  sc = S.generate(3, S.SceneConfig(objects="digits"), seed=0)
  assert {o.shape for objs in sc.objects for o in objs} <= set(S.DIGITS)


@pytest.mark.parametrize("kw,msg", [(dict(patch_size=5), "patch_size"), (dict(min_objects=3, max_objects=2), "objects"),
                                    (dict(max_size=40), "size"), (dict(objects="cifar"), "objects"),
                                    (dict(min_cover=0), "min_cover")])
def test_config_validation(kw, msg):
  with pytest.raises(ValueError, match=msg):
    S.SceneConfig(**kw)


def test_layout_cells_cover_all_combinations():
  seen = set(itertools.chain.from_iterable(((o.row, o.col) for o in objs) for objs in S.generate(60, seed=9).objects))
  assert len(seen) == 9
