"""Interpretability: lenses (logit, embedding, LatentLens), residual-update geometry with interventions, and
Tele-Lens probes of latent planning (`probes`)."""
from jaxlab.interp import geometry, lenses, probes, search
from jaxlab.interp.lenses import EmbeddingLens, LatentIndex, LatentLens, LogitLens, build_index

__all__ = ["geometry", "lenses", "probes", "search", "EmbeddingLens", "LatentIndex", "LatentLens", "LogitLens", "build_index"]
