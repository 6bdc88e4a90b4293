"""lost_in_attention: the `noise` claim on synthetic results, and disjoint training / evaluated scenes."""
import pytest

from experiments import lost_in_attention as lia, registry
from experiments._shared import vlm_pipeline as pipe
from experiments.lost_in_attention import run as run_lia
from experiments.runner import claims, splits


def _claim(cid):
  return next(c for c in registry.get("lost_in_attention").claims if c.id == cid)


def _results(none, noise):
  return {"accuracy.none": none, "accuracy.noise_delta": noise, "accuracy.noise_qkv": 0.0,
          "accuracy.fixed_attention": 0.0}


@pytest.mark.parametrize("none,noise,want", [(0.5, 0.5, True), (0.5, 0.7, True), (0.5, 0.49, False),
                                             (0.9, 0.1, False)])
def test_noise_claim_holds_exactly_when_noise_does_as_well_or_better(none, noise, want):
  c = _claim("noise")
  assert claims.holds(c, _results(none, noise)) is want
  assert claims.measurable(c, _results(none, noise)) is True


def test_noise_claim_is_not_measurable_when_the_model_gets_nothing_right():
  assert claims.measurable(_claim("noise"), _results(0.0, 0.0)) is False


def test_noise_claim_reads_keys_the_run_produces():
  produced = {f"accuracy.{n}" for n in ("none",) + lia.INTERVENTIONS}
  assert set(_claim("noise").all_keys) <= produced


def test_evaluated_scenes_are_not_training_scenes(tmp_path):
  cfg = lia.PRESETS["smoke"]
  train = pipe.training_captions(cfg.train, cfg.train.scenes)
  sc = run_lia.eval_scenes(cfg, cfg.train.scenes)
  assert len(sc.captions) == cfg.n_eval_scenes and not set(sc.captions) & set(train)
  data = run_lia.record_splits(str(tmp_path), train, sc.captions)
  assert splits.overlaps(data) == [] and len(data["test"]["scenes"]) == cfg.n_eval_scenes
  # seed + 5 and the size of the training draw: the first draw is the training scenes themselves, all skipped
  forced = lia.Config(train=cfg.train, n_eval_scenes=len(train), seed=cfg.train.seed - 3)
  got = run_lia.eval_scenes(forced, cfg.train.scenes)
  assert not set(got.captions) & set(train) and len(got.captions) == len(train)
  with pytest.raises(splits.SplitOverlap, match="scenes"):
    run_lia.record_splits(str(tmp_path), train, train[:2])


def test_geometry_under_an_intervention_is_the_intervened_models(tmp_path):
  import jax
  import numpy as np
  from experiments.lost_in_attention import geometry
  from jaxlab.data import load_tokenizer
  from jaxlab.data.tasks import scenes as scenes_lib
  from jaxlab.models import vlm
  cfg = lia.PRESETS["smoke"]
  vcfg = pipe.scene_vlm_config(cfg.train)
  tok = load_tokenizer(scenes_lib.save_tokenizer(str(tmp_path / "tok"), scenes_lib.vocabulary(cfg.train.scenes)))
  art = pipe.Artifacts(vcfg, vlm.init(vcfg, jax.random.PRNGKey(0)), tok, {}, cfg.train.scenes)
  batch = run_lia._scene_data(cfg, art)
  plain = run_lia.geometry_metrics(art, batch, 4)
  same = run_lia.geometry_metrics(art, batch, 4, intervention=geometry.noise_update(jax.random.PRNGKey(1), mix=0.0))
  uniform = run_lia.geometry_metrics(art, batch, 4, intervention=geometry.fixed_attention("uniform"))
  for m in lia.MODULES:
    for k in ("rid", "mixig"):
      np.testing.assert_allclose(same[m][k], plain[m][k], rtol=1e-4, atol=2e-5)  # op by op vs jitted
  assert not np.allclose(uniform["attention"]["mixig"], plain["attention"]["mixig"])
  _, lm = run_lia._intervene("noise_qkv", art, jax.random.PRNGKey(2), [0], 1.0)
  noised = run_lia.geometry_metrics(art, batch, 4, lm_params=lm)
  want = run_lia.geometry_metrics(art._replace(params={**art.params, "lm": lm}), batch, 4)
  np.testing.assert_allclose(noised["attention"]["rid"], want["attention"]["rid"], rtol=1e-6)
