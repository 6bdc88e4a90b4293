"""stllm: the full preset planned on `cpu-8` (each model's train step and greedy decoding on Qwen2-7B, at 4 frames
of 168 px to keep the test short), and without downloads its one-line stop naming the `hf download` of
Qwen/Qwen2-7B-Instruct."""
import pytest

from experiments.runner import plan as plan_lib
from experiments.runner import registry
from jaxlab.hf import hub

REPO = "Qwen/Qwen2-7B-Instruct"


@pytest.fixture
def nothing_downloaded(tmp_path, monkeypatch):
  monkeypatch.setenv(hub.MODELS_ENV, str(tmp_path / "models"))
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))


@pytest.mark.slow
def test_full_preset_plans_on_cpu_8():
  p = plan_lib.plan("stllm", "full", "cpu-8", ["room.n_frames=4", "room.image_size=168"])
  models = ("video_only", "points_only", "stllm_3d", "stllm_aligner")
  assert [w["name"] for w in p["workloads"]] == [f"{k}.{m}" for m in models for k in ("train_step", "generate")]
  assert isinstance(p["fits"], bool) and p["chips"] == 8
  for w in p["workloads"]:
    assert isinstance(w["fits"], bool) and w["bytes_per_chip"] > 0 and w["mesh"]["fsdp"] == 8, w["name"]
    assert w["steps"] >= 1 and 0.65 <= w["flops_per_step"] / w["analytic_flops_per_step"] <= 1.5, w["name"]
  assert all(w["steps"] == 3000 for w in p["workloads"] if w["kind"] == "train")


def test_full_preset_without_downloads_names_the_fetch_command(nothing_downloaded):
  with pytest.raises(registry.OverrideError) as e:
    registry.config_for("stllm", "full")
  line = str(e.value)
  assert "\n" not in line and f"hf download {REPO}" in line and "lm_path" in line
  assert hub.config(REPO) is not None  # the shipped architecture
