"""pass@k: the unbiased estimator of Chen et al. (2021), 1 - C(n-c, k) / C(n, k)."""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c of them correct) is correct."""
    if not 0 <= c <= n or n <= 0:
        raise ValueError(f"need 0 <= c <= n and n > 0, got n={n}, c={c}")
    if k > n:
        raise ValueError(f"k={k} exceeds the number of samples n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)
