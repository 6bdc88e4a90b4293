"""N-gram overlap scores of generated text against one reference each: corpus BLEU (Papineni et al., ACL 2002:
clipped n-gram precisions summed over the corpus, their geometric mean times the brevity penalty
exp(1 - r / c) when the candidates are shorter, c and r the total candidate and reference lengths; no
smoothing, so a corpus without a matching n-gram of some order scores 0) and ROUGE-L (Lin, 2004: F1 of the
longest common subsequence, P = LCS / |candidate|, R = LCS / |reference|, averaged over pairs). Texts are
token lists (split words).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Sequence


def _ngrams(tokens: Sequence[str], n: int) -> Counter:
  return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def corpus_bleu(candidates: Sequence[Sequence[str]], references: Sequence[Sequence[str]], max_n: int = 4) -> float:
  """BLEU-`max_n` in [0, 1] over the corpus (uniform weights)."""
  if len(candidates) != len(references):
    raise ValueError(f"need one reference per candidate, found {len(candidates)} and {len(references)}")
  match, total = [0] * max_n, [0] * max_n
  c_len = r_len = 0
  for cand, ref in zip(candidates, references):
    c_len, r_len = c_len + len(cand), r_len + len(ref)
    for n in range(1, max_n + 1):
      c, r = _ngrams(cand, n), _ngrams(ref, n)
      match[n - 1] += sum(min(k, r[g]) for g, k in c.items())
      total[n - 1] += max(len(cand) - n + 1, 0)
  if c_len == 0 or min(match) == 0:
    return 0.0
  log_p = sum(math.log(m / t) for m, t in zip(match, total)) / max_n
  bp = 1.0 if c_len > r_len else math.exp(1 - r_len / c_len)
  return bp * math.exp(log_p)


def lcs(a: Sequence[str], b: Sequence[str]) -> int:
  """Length of the longest common subsequence."""
  prev = [0] * (len(b) + 1)
  for x in a:
    cur = [0]
    for j, y in enumerate(b):
      cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
    prev = cur
  return prev[-1]


def rouge_l(candidates: Sequence[Sequence[str]], references: Sequence[Sequence[str]]) -> float:
  """Mean ROUGE-L F1 in [0, 1] (0 for a pair with an empty side)."""
  if len(candidates) != len(references) or not candidates:
    raise ValueError(f"need one reference per candidate and at least one pair, found {len(candidates)} and "
                     f"{len(references)}")
  out = 0.0
  for cand, ref in zip(candidates, references):
    m = lcs(cand, ref)
    if m:
      p, r = m / len(cand), m / len(ref)
      out += 2 * p * r / (p + r)
  return out / len(candidates)
