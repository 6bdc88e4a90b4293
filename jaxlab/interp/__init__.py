"""Interpretability: lenses (logit, embedding, LatentLens) and their search, and linear probes of hidden states
(`probes`)."""
from jaxlab.interp import lenses, probes, search
from jaxlab.interp.lenses import EmbeddingLens, LatentIndex, LatentLens, LogitLens, build_index

__all__ = ["lenses", "probes", "search", "EmbeddingLens", "LatentIndex", "LatentLens", "LogitLens", "build_index"]
