"""The latency of the ranker's three model paths, predicted from the rankers' own measured latency curve.

The brief's FLOP model (§4): a full forward over [prefix L | short-term S | candidates C] costs
F_full = n_l·(P·T + A·Q), with T = L + S + C tokens through the projections and
Q = L(L+1)/2 + S·L + S(S+1)/2 + C·(L+S+1) query-key pairs. Latency is modelled as t0 + k·F_full, that is

    latency_ms(L, S, C) = fixed_ms + per_token_ms · T + per_pair_ms · Q

with per_token_ms = k·n_l·P and per_pair_ms = k·n_l·A. The model dimensions and the device speed k only ever
appear in these two products, so the fit takes them as free coefficients instead of deriving P and A: the
profile's kv_bytes_per_token fixes n_l·A only up to the element size, and nothing in it fixes P (the
projection width), so a derived P/A would be a guess. The three coefficients are fitted by non-negative least
squares on `full_ms` over the curve's points, each first lowered to the least latency measured at it or any
longer prefix: cost cannot fall as L grows and timing noise only ever adds, so that is still an upper bound on
the true cost, and one stalled measurement (seen at the first point of a busy host) cannot flatten the whole
curve. The squares are of relative errors (each point weighted by 1/latency): the curve spans two orders of
magnitude, and with absolute errors the longest points alone would set the fit while a prediction at the short
end, where the trigger's break-even lies, could be off by half. At the profile's own S and C, T is linear and
Q is quadratic in L, so this is the quadratic fit a + b·L + c·L² of the measured curve with its coefficients
tied to the formula; its extrapolation to another S and C follows the formula (with P/A as fitted).
Non-negative coefficients make every prediction monotone in L, S and C.

The same form, with the tokens and pairs each path computes, models the other two paths (`Path`): a
pre-inference computes the prefix alone (T = L, Q = L(L+1)/2), a cached rank only the short-term events
and candidates against it (T = S + C, Q = S·L + S(S+1)/2 + C·(L+S+1)); each is fitted on its own column of
the curve (`pre_infer_ms`, `rank_ms`). What it costs the ranker in the background is the pre-inference.

What relay moves off a request's critical path is the prefix's own computation: F_full - F_cached = F_pre
exactly, so it is the pre-inference path's `compute_ms`, its per-token and per-pair terms without the fixed
cost of a model call (which a miss and a cached rank both pay once). It is one fitted quantity, so the
trigger's gain test does not depend on the difference of two separately fitted curves, whose intercepts
each carry their own warm-up noise.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Sequence

import numpy as np


def projected_tokens(prefix_length: int, short_term_length: int, num_candidates: int) -> int:
    """Tokens that pass through the per-token projections: T = L + S + C."""
    return prefix_length + short_term_length + num_candidates


def attended_pairs(prefix_length: int, short_term_length: int, num_candidates: int) -> int:
    """Query-key pairs of the masked attention: prefix causal, short-term over all before it, candidates
    over every non-candidate key and themselves."""
    prefix, short, cands = prefix_length, short_term_length, num_candidates
    causal = prefix * (prefix + 1) // 2 + short * prefix + short * (short + 1) // 2
    return causal + cands * (prefix + short + 1)


class Path(enum.Enum):
    """A model path: ranking without relay, pre-inference of the prefix, a rank against a cached prefix."""

    FULL = "full_ms"
    PRE_INFER = "pre_infer_ms"
    CACHED = "rank_ms"

    def features(self, prefix_length: int, short_term_length: int, num_candidates: int) -> tuple[int, int]:
        """(tokens through the projections, query-key pairs) this path computes."""
        full_tokens = projected_tokens(prefix_length, short_term_length, num_candidates)
        full_pairs = attended_pairs(prefix_length, short_term_length, num_candidates)
        prefix_pairs = prefix_length * (prefix_length + 1) // 2
        if self is Path.FULL:
            return full_tokens, full_pairs
        if self is Path.PRE_INFER:
            return prefix_length, prefix_pairs
        return full_tokens - prefix_length, full_pairs - prefix_pairs


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Predicted latency of one path (by default ranking without relay); coefficients are non-negative."""

    fixed_ms: float
    per_token_ms: float
    per_pair_ms: float
    path: Path = Path.FULL

    @classmethod
    def fit(
        cls,
        points: Sequence[tuple[int, float]],
        short_term_length: int,
        num_candidates: int,
        path: Path = Path.FULL,
    ) -> CostModel:
        """Fits (prefix_length, full_ms) points measured at one short-term length and candidate count."""
        if not points:
            raise ValueError("the latency curve has no points")
        ordered = sorted(points)
        lengths = np.array([length for length, _ in ordered], dtype=np.float64)
        latencies = np.array([ms for _, ms in ordered], dtype=np.float64)
        if (lengths <= 0).any() or not np.isfinite(latencies).all() or (latencies < 0).any():
            raise ValueError("latency curve points need positive lengths and finite, non-negative latencies")
        latencies = np.minimum.accumulate(latencies[::-1])[::-1]
        features = np.array(
            [[1.0, *path.features(int(n), short_term_length, num_candidates)] for n in lengths]
        )
        # Relative errors: each row divided by its latency (positive after the lowering, or 0 only when a
        # path measured nothing at all, then weighted as 1 ms).
        weights = 1.0 / np.maximum(latencies, 1e-3)
        fixed, per_token, per_pair = _nonnegative_least_squares(
            features * weights[:, None], latencies * weights
        ).tolist()
        return cls(fixed_ms=fixed, per_token_ms=per_token, per_pair_ms=per_pair, path=path)

    def predict_ms(self, prefix_length: int, short_term_length: int, num_candidates: int) -> float:
        return self.fixed_ms + self.compute_ms(prefix_length, short_term_length, num_candidates)

    def compute_ms(self, prefix_length: int, short_term_length: int, num_candidates: int) -> float:
        """The path's work on its tokens and pairs, without the fixed cost of a call."""
        tokens, pairs = self.path.features(prefix_length, short_term_length, num_candidates)
        return self.per_token_ms * tokens + self.per_pair_ms * pairs


def _nonnegative_least_squares(features: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """argmin ‖features·x - targets‖ subject to x ≥ 0, exactly, by trying every support set.

    With three unknowns there are eight supports; the optimum is the unconstrained least-squares solution
    on one of them, so the best feasible one is it. Columns are scaled to unit maximum for conditioning
    (pair counts reach 10⁷ while the constant column is 1).
    """
    scale = np.abs(features).max(axis=0)
    scale[scale == 0] = 1.0
    scaled = features / scale
    width = scaled.shape[1]
    best_residual, best = np.inf, np.zeros(width)
    for support in itertools.product((False, True), repeat=width):
        columns = [i for i, used in enumerate(support) if used]
        solution = np.zeros(width)
        if columns:
            solution[columns] = np.linalg.lstsq(scaled[:, columns], targets, rcond=None)[0]
            if (solution < 0).any():
                continue
        residual = float(np.sum((scaled @ solution - targets) ** 2))
        if residual < best_residual:
            best_residual, best = residual, solution
    return best / scale
