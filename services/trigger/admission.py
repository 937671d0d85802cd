"""The trigger's admission policy: which requests get their prefix pre-inferred. Pure logic, no transport.

`AdmissionPolicy.decide` checks, in this order, and answers with the first that applies:

1. NOT_AT_RISK: the predicted ranking latency without relay is within the risk threshold; relay would
   not pay for the cache it occupies and the load it adds.
2. DUPLICATE: the same prefix key (user and exact long-term sequence) was admitted within the lease
   window; its PreInfer is in flight or its prefix is leased. The instance that holds it is returned with
   the refusal, so the caller's Rank can still carry the hint (empty while the first PreInfer is unanswered).
3. FOOTPRINT_LIMIT: the bytes admitted within the lease window plus this prefix's would exceed the budget.
4. LOAD_LIMIT: the token bucket on pre-inferred tokens cannot pay for this prefix now.
5. ADMITTED: the prefix's bytes and tokens are reserved.

The trigger never sees a Rank consume a prefix, so an admission's bytes count for the whole lease window
(the ranker's lease on an unconsumed prefix lasts as long); that bounds admitted-but-unconsumed bytes from
above. A refused request reserves nothing. After the PreInfer answer, `cancel` undoes an admission the
ranker refused (bytes, tokens and the duplicate record), and `confirm` records where an admitted prefix
lives, returning its tokens when the ranker did not have to compute it (already cached, or reloaded).

Not thread-safe: the trigger calls it from its event loop only. Time comes from the injected clock
(monotonic seconds), so tests drive it without sleeping.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import time
from collections.abc import Callable, Hashable


class Reason(enum.Enum):
    """Why a request was or was not admitted; the names are AdmitReason's without its prefix."""

    ADMITTED = enum.auto()
    NOT_AT_RISK = enum.auto()
    FOOTPRINT_LIMIT = enum.auto()
    LOAD_LIMIT = enum.auto()
    DUPLICATE = enum.auto()
    RANKER_REFUSED = enum.auto()


@dataclasses.dataclass(frozen=True)
class Decision:
    reason: Reason
    relay_instance: str = ""

    @property
    def admitted(self) -> bool:
        return self.reason is Reason.ADMITTED


@dataclasses.dataclass(frozen=True)
class AdmissionLimits:
    risk_threshold_ms: float
    footprint_budget_bytes: int
    lease_window_s: float


class TokenBucket:
    """Tokens accrue at `rate` per second up to `burst`; a take either pays in full or takes nothing."""

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._level = burst
        self._updated = now

    def level(self, now: float) -> float:
        self._level = min(self.burst, self._level + self.rate * max(0.0, now - self._updated))
        self._updated = max(self._updated, now)
        return self._level

    def take(self, tokens: float, now: float) -> bool:
        if self.level(now) < tokens:
            return False
        self._level -= tokens
        return True

    def give_back(self, tokens: float, now: float) -> None:
        self._level = min(self.burst, self.level(now) + tokens)

    def resize(self, rate: float, burst: float, now: float) -> None:
        """Changes rate and depth keeping the deficit, so a bucket that grows is not refilled for free."""
        deficit = self.burst - self.level(now)
        self.rate, self.burst = rate, burst
        self._level = max(0.0, burst - deficit)


@dataclasses.dataclass
class _Admission:
    expires_at: float
    footprint_bytes: int
    tokens: int
    relay_instance: str = ""


class AdmissionPolicy:
    """At-risk rule, footprint bound over the lease window, token bucket and duplicate suppression."""

    def __init__(self, limits: AdmissionLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        # No load may be admitted until `set_load_limit` says how much.
        self._bucket = TokenBucket(rate=0.0, burst=0.0, now=clock())
        # Insertion order is expiry order: every admission lives for the same window.
        self._admissions: collections.OrderedDict[Hashable, _Admission] = collections.OrderedDict()
        self._footprint_bytes = 0

    def set_load_limit(self, tokens_per_s: float, burst_tokens: float) -> None:
        self._bucket.resize(tokens_per_s, burst_tokens, self._clock())

    @property
    def footprint_bytes(self) -> int:
        """Bytes admitted within the current lease window."""
        self._expire(self._clock())
        return self._footprint_bytes

    @property
    def tokens_available(self) -> float:
        return self._bucket.level(self._clock())

    def decide(self, key: Hashable, tokens: int, footprint_bytes: int, predicted_ms: float) -> Decision:
        """Admits (reserving bytes and tokens) or refuses the prefix `key` of `tokens` events."""
        now = self._clock()
        self._expire(now)
        if predicted_ms <= self.limits.risk_threshold_ms:
            return Decision(Reason.NOT_AT_RISK)
        earlier = self._admissions.get(key)
        if earlier is not None:
            return Decision(Reason.DUPLICATE, earlier.relay_instance)
        if self._footprint_bytes + footprint_bytes > self.limits.footprint_budget_bytes:
            return Decision(Reason.FOOTPRINT_LIMIT)
        if not self._bucket.take(tokens, now):
            return Decision(Reason.LOAD_LIMIT)
        self._admissions[key] = _Admission(now + self.limits.lease_window_s, footprint_bytes, tokens)
        self._footprint_bytes += footprint_bytes
        return Decision(Reason.ADMITTED)

    def confirm(self, key: Hashable, relay_instance: str, computed: bool) -> None:
        """Records the instance holding an admitted prefix; `computed=False` returns its tokens."""
        admission = self._admissions.get(key)
        if admission is None:
            return
        admission.relay_instance = relay_instance
        if not computed:
            self._bucket.give_back(admission.tokens, self._clock())
            admission.tokens = 0

    def cancel(self, key: Hashable) -> None:
        """Undoes an admission whose PreInfer the ranker refused: its bytes, tokens and duplicate record."""
        admission = self._admissions.pop(key, None)
        if admission is None:
            return
        self._footprint_bytes -= admission.footprint_bytes
        self._bucket.give_back(admission.tokens, self._clock())

    def _expire(self, now: float) -> None:
        while self._admissions:
            key, oldest = next(iter(self._admissions.items()))
            if oldest.expires_at > now:
                return
            del self._admissions[key]
            self._footprint_bytes -= oldest.footprint_bytes
