"""Seconds as a function of the batch: a least-squares line, and the measured points it keeps.

A profile (`tfdist.advise.profile`) times each layer and the whole step at a few batches; a
`Line` reads a cost at any batch from them, and the network probe (`tfdist.advise.network`)
fits its links with `fit_line`.

Example:
    >>> fit_curve([1, 3], [2.0, 4.0]).at(2)
    3.0
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

__all__ = ["Line", "fit_line", "fit_curve"]


@dataclasses.dataclass(frozen=True)
class Line:
    """``seconds(batch) = c0 + c1 * batch``, or where measured points are known
    (``points``: ``(batch, seconds)``, batches ascending), straight between the two points
    around ``batch``, the line beyond them. A step is not a line in the batch everywhere:
    oneDNN and Keras change kernels and paths with the batch (the deep MLP's ``fit`` step
    here: 3.7, 4.9, 7.0, 11.8 ms at 32, 64, 128, 256 rows), so the batches a layout trains
    (a replica's share, a micro-batch) are measured, not read off a line through two.

    Example:
        >>> Line(0.001, 1e-5).at(100)
        0.002
        >>> Line(0.0, 1.0, points=((1, 1.0), (3, 9.0))).at(2)   # between the points
        5.0
    """

    c0: float
    c1: float
    points: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:  # from JSON: lists
        object.__setattr__(self, "points", tuple((float(b), float(t)) for b, t in self.points))

    def at(self, batch: float) -> float:
        if len(self.points) > 1 and self.points[0][0] <= batch <= self.points[-1][0]:
            xs, ys = zip(*self.points, strict=True)
            return max(0.0, float(np.interp(batch, xs, ys)))
        return max(0.0, self.c0 + self.c1 * batch)


def fit_line(x: Sequence[float], y: Sequence[float]) -> Line:
    """Least-squares line through ``(x, y)``; one point gives a line through the origin.

    Example:
        >>> line = fit_line([1, 3], [2, 4])
        >>> round(line.c0, 6), round(line.c1, 6)
        (1.0, 1.0)
    """
    if len(set(x)) < 2:
        return Line(0.0, float(np.mean(y)) / float(np.mean(x)))
    c1, c0 = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return Line(float(c0), float(c1))


def fit_curve(x: Sequence[float], y: Sequence[float]) -> Line:
    """`fit_line`, keeping the points themselves (one per batch, the median of its
    readings), so `Line.at` reads a measured batch as measured.

    Example:
        >>> curve = fit_curve([32, 64, 128, 256], [3.7, 4.9, 7.0, 11.8])
        >>> curve.at(128), round(curve.at(96), 2)
        (7.0, 5.95)
    """
    line = fit_line(x, y)
    points = tuple((float(b), float(np.median([t for xb, t in zip(x, y, strict=True)
                                                 if xb == b]))) for b in sorted(set(x)))
    return dataclasses.replace(line, points=points)
