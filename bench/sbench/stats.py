"""Order statistics of samples (seconds, or anything else)."""

import statistics
from collections.abc import Sequence


def pct(samples: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation; NaN for no samples."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summary(samples: Sequence[float]) -> dict[str, float]:
    """p50, p90, min and the count of a list of samples."""
    return {
        "p50": pct(samples, 0.5),
        "p90": pct(samples, 0.9),
        "min": min(samples) if samples else float("nan"),
        "n": len(samples),
    }


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples) if samples else float("nan")
