"""Interpretability: lenses (logit, embedding, LatentLens) and residual-update geometry with interventions."""
from jaxlab.interp import geometry, lenses, search
from jaxlab.interp.lenses import EmbeddingLens, LatentIndex, LatentLens, LogitLens, build_index

__all__ = ["geometry", "lenses", "search", "EmbeddingLens", "LatentIndex", "LatentLens", "LogitLens", "build_index"]
