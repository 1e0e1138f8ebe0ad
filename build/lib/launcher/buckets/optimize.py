"""Bucket boundaries that minimise padding, found exactly rather than by a grid search.

Cost model. Bucket k holds the samples with b[k-1] < length <= b[k] (b[0] = 0). Every batch
drawn from bucket k is padded to L_k, the longest sample in bucket k, and so holds
n_k = floor(B / L_k) samples under a token budget of B (the last, partial batch fewer, also
padded to L_k). A batch's padded tokens are its size times the length it is padded to, so
bucket k costs exactly N_k * L_k padded tokens for its N_k samples, a plan costs
C = sum_k N_k * L_k, and its modelled padding efficiency is (sum of all lengths) / C. Greedy
packing pads a batch only to its own longest sample, never more than L_k, so C is an upper bound
on what the real batching pays; `simulate` measures that real figure.

Optimisation. C depends only on which samples share a bucket, and a bucket's cost does not change
when its upper boundary moves down to its longest sample, so an optimal plan puts every inner
boundary on a distinct length present in the data. Over the D distinct lengths v_0 < ... < v_{D-1}
(counts c_i, prefix sums P_j = c_0 + ... + c_{j-1}) the plan is a split into K contiguous,
non-empty groups, and the dynamic programme

    F_g(j) = min over i < j of F_{g-1}(i) + (P_j - P_i) * v_{j-1},    F_0(0) = 0

(F_g(j): cheapest cost of the j shortest distinct lengths in g buckets) gives the minimum
F_K(D) over every choice of boundaries, hence no grid search on the same data can do better
under this model. For a fixed j the candidates are lines in t = v_{j-1} with slope -P_i and
intercept F_{g-1}(i); slopes fall as i grows and queries rise with j, so a monotone lower
envelope (the convex hull trick) answers each F_g(j) in amortised O(1). The whole programme is
O(K * D) with exact integer arithmetic (Python ints: no rounding, no overflow), e.g. about
50,000 steps for K = 6 and D = 8,192.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numpy.typing import NDArray

Lengths = NDArray[np.int64]


@dataclass(frozen=True)
class Plan:
    """Optimal boundaries for K buckets and what the cost model says about them."""

    boundaries: list[int]  # K + 1 values: 0, the upper bound of bucket 1, ..., the top
    samples: list[int]  # N_k
    longest: list[int]  # L_k, the longest sample in bucket k
    budget: int
    real_tokens: int
    padded_tokens: int  # C under the cost model
    distinct: int  # D

    @property
    def model_batch_sizes(self) -> list[int]:
        """n_k = floor(B / L_k): the batch size when every batch is padded to L_k."""
        return [self.budget // longest for longest in self.longest]

    @property
    def model_efficiency(self) -> float:
        return self.real_tokens / self.padded_tokens


def histogram(ordered: Lengths) -> tuple[list[int], list[int]]:
    """Distinct lengths ascending and their counts, as Python ints."""
    values, counts = np.unique(ordered, return_counts=True)
    return [int(v) for v in values], [int(c) for c in counts]


def optimal_groups(values: list[int], counts: list[int], groups: int) -> tuple[int, list[int]]:
    """Split the distinct lengths into `groups` contiguous non-empty groups of least cost.

    Returns the cost and each group's end index (exclusive) into `values`; group [i, j) costs
    (counts[i] + ... + counts[j-1]) * values[j-1].
    """
    d = len(values)
    if not 1 <= groups <= d:
        raise ValueError(f"cannot split {d} distinct lengths into {groups} non-empty groups")
    prefix = [0]
    for count in counts:
        prefix.append(prefix[-1] + count)
    previous: list[int] = [0] * (d + 1)  # F_{g-1}; only the reachable entries are read
    choices: list[list[int]] = []
    for g in range(1, groups + 1):
        current = [0] * (d + 1)
        choice = [0] * (d + 1)
        hull: deque[int] = deque()  # line i: y = previous[i] - prefix[i] * t
        # j shortest distinct lengths in g groups, leaving one per group still to come.
        for j in range(g, d - (groups - g) + 1):
            new = j - 1
            if g == 1 and new > 0:
                pass  # F_0 is finite only at 0: one bucket starts at the shortest length
            else:
                _add_line(hull, new, previous, prefix)
            t = values[j - 1]
            while len(hull) >= 2 and (
                previous[hull[1]] - prefix[hull[1]] * t <= previous[hull[0]] - prefix[hull[0]] * t
            ):
                hull.popleft()
            best = hull[0]
            current[j] = previous[best] + (prefix[j] - prefix[best]) * t
            choice[j] = best
        choices.append(choice)
        previous = current
    ends: list[int] = []
    j = d
    for choice in reversed(choices):
        ends.append(j)
        j = choice[j]
    ends.reverse()
    return previous[d], ends


def _add_line(hull: deque[int], new: int, intercepts: list[int], prefix: list[int]) -> None:
    """Append line `new` (y = intercepts[new] - prefix[new] * t) to the lower envelope.

    Lines arrive with falling slopes; the last line b is dropped while the newcomer overtakes the
    one before it (a) no later than b does, since b is then lowest nowhere.
    """
    while len(hull) >= 2:
        a, b = hull[-2], hull[-1]
        if (intercepts[new] - intercepts[a]) * (prefix[b] - prefix[a]) <= (
            intercepts[b] - intercepts[a]
        ) * (prefix[new] - prefix[a]):
            hull.pop()
        else:
            break
    hull.append(new)


def plan_buckets(ordered: Lengths, *, buckets: int, budget: int, top: int) -> Plan:
    """The optimal plan for lengths sorted ascending; the last boundary is `top` (>= longest)."""
    values, counts = histogram(ordered)
    cost, ends = optimal_groups(values, counts, buckets)
    starts = [0, *ends[:-1]]
    samples = [sum(counts[i:j]) for i, j in zip(starts, ends, strict=True)]
    longest = [values[j - 1] for j in ends]
    boundaries = [0, *longest[:-1], top]
    return Plan(
        boundaries=boundaries,
        samples=samples,
        longest=longest,
        budget=budget,
        real_tokens=int(ordered.sum()),
        padded_tokens=cost,
        distinct=len(values),
    )


def model_padded_tokens(lengths: Lengths, boundaries: list[int]) -> int:
    """C for any boundaries: sum over buckets (b[k-1], b[k]] of N_k * L_k."""
    if any(b <= a for a, b in pairwise(boundaries)):
        raise ValueError(f"boundaries must increase strictly: {boundaries}")
    if int(lengths.min()) <= boundaries[0] or int(lengths.max()) > boundaries[-1]:
        raise ValueError(f"lengths outside ({boundaries[0]}, {boundaries[-1]}]")
    ordered = np.sort(lengths)
    cuts = np.searchsorted(ordered, boundaries[1:], side="right")
    total = 0
    low = 0
    for high in cuts.tolist():
        if high > low:
            total += (high - low) * int(ordered[high - 1])
        low = high
    return total
