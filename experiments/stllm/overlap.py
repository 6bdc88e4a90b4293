"""N-gram overlap scores of generated text against one reference each, computed by the libraries that define
them: corpus BLEU (Papineni et al., ACL 2002) by NLTK's `corpus_bleu` (clipped n-gram precisions summed over
the corpus, uniform weights, the brevity penalty, no smoothing, so a corpus without a matching n-gram of some
order scores 0) and ROUGE-L (Lin, 2004) by Google's `rouge_score`
(F1 of the longest common subsequence, averaged over pairs; its tokenizer lower-cases and splits at
non-alphanumerics). Texts are token lists (split words).
"""
from __future__ import annotations

import warnings
from typing import Sequence

from nltk.translate import bleu_score
from rouge_score import rouge_scorer

_ROUGE_L = rouge_scorer.RougeScorer(["rougeL"])


def corpus_bleu(candidates: Sequence[Sequence[str]], references: Sequence[Sequence[str]], max_n: int = 4) -> float:
  """BLEU-`max_n` in [0, 1] over the corpus (uniform weights)."""
  if len(candidates) != len(references):
    raise ValueError(f"need one reference per candidate, found {len(candidates)} and {len(references)}")
  if not any(len(c) for c in candidates):
    return 0.0
  with warnings.catch_warnings():  # NLTK warns when an order has no match; the score is then 0, as defined
    warnings.simplefilter("ignore", UserWarning)
    score = bleu_score.corpus_bleu([[list(r)] for r in references], [list(c) for c in candidates],
                                   weights=(1 / max_n,) * max_n)
  # NLTK stands sys.float_info.min in for a zero precision, so a BLEU that is 0 by definition comes out ~1e-77
  return float(score) if score > 1e-30 else 0.0


def rouge_l(candidates: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
  """Mean ROUGE-L F1 in [0, 1] (0 for a pair with an empty side)."""
  if len(candidates) != len(references) or not candidates:
    raise ValueError(f"need one reference per candidate and at least one pair, found {len(candidates)} and "
                     f"{len(references)}")
  scores = [_ROUGE_L.score(" ".join(r), " ".join(c))["rougeL"].fmeasure for c, r in zip(candidates, references)]
  return sum(scores) / len(scores)
