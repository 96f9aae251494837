"""Min-p's cut, one definition for both samplers (torch-free: the numpy runner imports it).

Min-p keeps the tokens whose probability is at least ``min_p`` times the most likely
token's, as transformers' MinPLogitsWarper, vLLM and llama.cpp define it. A ratio of two
probabilities of one softmax is ``exp(l - top)`` whatever the normalisation, so the rule is a
floor on the temperature-scaled logits: keep ``l >= top + log(min_p)``. Both samplers add
``margin(min_p)`` to the row's largest scaled logit in float32, so they cut at the same bits.

Order: temperature, then top-k, top-p and min-p, transformers' order. Min-p after top-k or
top-p keeps the same tokens as before them (the largest logit survives both, and the ratio
ignores their renormalisation), so the kept set is the three sets' intersection: every token
at or above the highest of the three floors.
"""

from __future__ import annotations

import math


def margin(min_p: float) -> float:
    """How far below the row's largest scaled logit min-p cuts; ``-inf`` when off (0)."""
    # log(0) would raise; min_p 0 keeps everything, as transformers' probs < 0 removes none.
    return math.log(min_p) if min_p > 0 else float("-inf")
