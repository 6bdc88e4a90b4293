"""latentlens: the paper's index and judged layers, and disjoint index / training / judged scenes."""
import numpy as np
import pytest

from experiments import latentlens as ll
from experiments._shared import vlm_pipeline as pipe
from experiments.latentlens import run as run_ll
from experiments.runner import splits
from jaxlab.data.tasks import scenes as S


@pytest.mark.parametrize("n_layers,index,judged", [
    (32, (1, 2, 4, 8, 16, 24, 30, 31), (0, 1, 2, 4, 8, 16, 24, 30, 31)),  # the paper's 7-8B LMs
    (28, (1, 2, 4, 8, 16, 24, 26, 27), (0, 1, 2, 4, 8, 16, 24, 26, 27)),  # Qwen2-7B
    (25, (1, 2, 4, 8, 16, 23, 24), (0, 1, 2, 4, 8, 16, 23, 24)),  # 24 = L-1 once
    (3, (1, 2), (0, 1, 2)),  # the cpu LM
    (2, (0, 1), (0, 1)),  # the smoke LM
    (1, (0,), (0,)),
])
def test_paper_layers_clipped_and_deduplicated(n_layers, index, judged):
  assert run_ll.default_index_layers(n_layers) == index
  assert run_ll.default_judged_layers(n_layers) == judged
  brute = lambda fixed: tuple(sorted({l for l in fixed + [n_layers - 2, n_layers - 1] if 0 <= l < n_layers}))
  assert index == brute([1, 2, 4, 8, 16, 24]) and judged == brute([0, 1, 2, 4, 8, 16, 24])


def test_config_rejects_bad_layer_lists():
  for bad in ((), (2, 1), (1, 1), (-1, 2)):
    with pytest.raises(ValueError, match="judged_layers"):
      ll.Config(judged_layers=bad)


def test_text_scene_recovers_every_caption_carrying_style():
  rng = np.random.default_rng(0)
  for _ in range(200):
    objs, bg = S._random_objects(S.SceneConfig(), rng)
    for style in (0, 1, 2):
      assert run_ll.text_scene(S.describe(objs, bg, style, rng)) == S.caption(objs, bg), style
  sc = S.generate(5, seed=3)
  assert [run_ll.text_scene(S.grid_text(sc, i, rng)) for i in range(5)] == sc.captions
  assert run_ll.text_scene(S.general_text(rng)) is None


def test_disjoint_scenes_skips_excluded_captions_only():
  cfg = S.SceneConfig()
  base = S.generate(6, cfg, seed=9)
  assert pipe.disjoint_scenes(6, cfg, 9, []).captions == base.captions
  got = pipe.disjoint_scenes(6, cfg, 9, base.captions[1:3])
  assert len(got.captions) == 6 and not set(got.captions) & set(base.captions[1:3])
  assert got.images.shape == base.images.shape and len(got.objects) == 6
  first = S.generate(12, cfg, seed=9)  # drawn again with room: the kept scenes, in order
  keep = [i for i, c in enumerate(first.captions) if c not in base.captions[1:3]][:6]
  np.testing.assert_array_equal(got.patch_object, first.patch_object[keep])
  assert got.captions == [first.captions[i] for i in keep]


def test_scene_data_splits_are_disjoint_and_checked(tmp_path):
  cfg = ll.PRESETS["smoke"]
  sc_cfg = cfg.train.scenes
  scenes, texts, train = run_ll.scene_data(cfg, sc_cfg)
  assert train == S.generate(cfg.train.n_train_scenes, sc_cfg, seed=cfg.train.seed + 2).captions
  assert not set(scenes.captions) & set(train)
  assert not set(scenes.captions) & {run_ll.text_scene(t) for t in texts}
  data = run_ll.record_splits(str(tmp_path), scenes, texts, train)
  assert splits.overlaps(data) == [] and len(data["test"]["scenes"]) == cfg.n_eval_scenes
  # the builder is what keeps them apart: a judged scene among the index texts is refused
  with pytest.raises(splits.SplitOverlap, match="scenes"):
    run_ll.record_splits(str(tmp_path), scenes, texts + [scenes.captions[0]], train)


def test_index_texts_drop_texts_about_judged_scenes():
  cfg = S.SceneConfig()
  texts = S.text_corpus(400, cfg, seed=5, styles=(0.2,) * 5)
  judged = [c for c in map(run_ll.text_scene, texts) if c is not None][:7]
  kept = run_ll.index_texts(400, cfg, 5, (0.2,) * 5, judged)
  assert kept == [t for t in texts if run_ll.text_scene(t) not in set(judged)] and len(kept) < len(texts)

