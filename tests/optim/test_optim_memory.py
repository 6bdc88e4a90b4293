"""Memory accounting: a hand count on the tiny config, and the SCALE paper's memory table (arXiv 2506.16659)."""
import jax
import pytest

from jaxlab import optim
from jaxlab.models import transformer as tfm
from jaxlab.optim import memory

# tiny: V=256, D=64, L=2, H=4, G=2, K=16, F=176, untied.
V, D, L, H, G, K, F = 256, 64, 2, 4, 2, 16, 176
KERNELS = D * H * K + 2 * D * G * K + H * K * D + 3 * D * F  # q, k, v, o, gate, up, down (one layer)
NORMS = L * 2 * D + D  # attn_norm, mlp_norm per layer, final_norm
N_PARAMS = 2 * V * D + L * KERNELS + NORMS
COUNTERS = 32  # small scalars in a state: step counters, Newton-Schulz coefficients


def test_tiny_config_shapes_match_the_hand_count():
  cfg = tfm.Config.tiny()
  got = (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.kv_heads, cfg.kdim, cfg.d_ff)
  assert got == (V, D, L, H, G, K, F)
  assert memory.tree_bytes(memory.param_shapes(cfg)) == 4 * N_PARAMS
  assert memory.tree_bytes(memory.param_shapes(cfg, "bfloat16")) == 2 * N_PARAMS


@pytest.mark.parametrize("name,hand", [
    ("adamw", 2 * 4 * N_PARAMS),  # mu, nu for everything
    ("scale", 4 * (D * V + 2 * NORMS)),  # lm_head momentum, Adam on the norms
    ("sgd_colnorm", 4 * 2 * NORMS),
    ("colnorm_momentum", 4 * (2 * V * D + L * KERNELS + 2 * NORMS)),
    ("muon", 4 * (L * KERNELS + 2 * (2 * V * D + NORMS))),  # momentum on hidden matrices, Adam elsewhere
])
def test_state_bytes_hand_count(name, hand):
  got = memory.state_bytes(name, memory.param_shapes(tfm.Config.tiny()))
  assert hand <= got <= hand + COUNTERS


def test_galore_state_bytes_hand_count():
  r = 8
  # [out, in]: q, o 64x64 -> Q [r, in] + moments [out, r]; k, v 32x64 (out < in) -> Q [out, r] + moments [r, in];
  # gate, up 176x64 -> Q [r, 64] + moments [176, r]; down 64x176 -> Q [64, r] + moments [r, 176].
  per_layer = (2 * (r * 64 + 2 * 64 * r) + 2 * (32 * r + 2 * r * 64) + 2 * (r * 64 + 2 * 176 * r)
               + (64 * r + 2 * r * 176))
  hand = 4 * (L * per_layer + 2 * (2 * V * D + NORMS))
  got = memory.state_bytes(optim.galore(1e-3, axes=tfm.AXES, rank=r), memory.param_shapes(tfm.Config.tiny()))
  assert hand <= got <= hand + COUNTERS


def test_tied_scale_state_is_the_embedding_momentum():
  got = memory.state_bytes("scale", memory.param_shapes(tfm.Config.tiny(tie_embeddings=True)))
  assert 4 * (V * D + 2 * NORMS) <= got <= 4 * (V * D + 2 * NORMS) + COUNTERS


def test_training_memory_hand_count():
  cfg = tfm.Config.tiny()
  b, t = 3, 32
  m = memory.training_memory(cfg, "adamw", b, t)
  per_layer = 4 * b * t * (4 * D + 2 * H * K + 2 * G * K + 3 * F) + 4 * b * H * t * t
  acts = L * per_layer + 4 * 2 * b * t * D + 4 * b * t * V
  assert m["params"] == m["grads"] == 4 * N_PARAMS
  assert m["activations"] == acts
  assert m["total"] == 2 * 4 * N_PARAMS + m["optimizer_state"] + acts
  assert m["model_and_optimizer"] == 4 * N_PARAMS + m["optimizer_state"]
  remat = memory.training_memory(cfg.replace(remat=True, dtype="bfloat16"), "scale", b, t, param_dtype="bfloat16")
  per_layer16 = 2 * b * t * (4 * D + 2 * H * K + 2 * G * K + 3 * F) + 4 * b * H * t * t
  assert remat["params"] == 2 * N_PARAMS
  assert remat["activations"] == 2 * L * b * t * D + per_layer16 + 2 * 2 * b * t * D + 4 * b * t * V


# The paper's memory table (params + optimizer state, bf16, GB), untied GaLore LLaMA configs.
PAPER = {"llama-60m": {"adamw": .35, "scale": .15, "apollo_mini": .25},
         "llama-130m": {"adamw": .81, "scale": .32, "apollo_mini": .46},
         "llama-350m": {"adamw": 2.21, "scale": .80, "apollo_mini": 1.00},
         "llama-1b": {"adamw": 8.04, "scale": 2.81, "apollo_mini": 3.20},
         "llama-7b": {"scale": 13.74, "apollo": 16.14, "apollo_mini": 14.53}}


@pytest.mark.parametrize("preset", list(PAPER))
def test_model_and_optimizer_memory_matches_paper_table(preset):
  shapes = memory.param_shapes(tfm.PRESETS[preset], "bfloat16")
  for name, gb in PAPER[preset].items():
    got = (memory.tree_bytes(shapes) + memory.state_bytes(name, shapes)) / 1e9
    assert abs(got - gb) < 0.0075, f"{preset} {name}: {got:.4f} GB, paper {gb} GB"


def test_nothing_is_allocated():
  before = len(jax.live_arrays())
  memory.training_memory(tfm.PRESETS["llama-1b"], "scale", 512, 256, param_dtype="bfloat16")
  assert len(jax.live_arrays()) == before
