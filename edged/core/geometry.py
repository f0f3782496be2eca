"""Polygons in the image: masks and zones. Points are source-frame pixels, or fractions of the frame
when every coordinate is within 0..1. Checked once (at least 3 points, inside the frame, no edge
crossing another), then scaled to the frame size the source really delivers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import Field

Point = tuple[float, float]
Points = Annotated[list[tuple[float, float]], Field(min_length=3, max_length=64)]


def is_fraction(points: Sequence[Point]) -> bool:
    """Whether the polygon is given in fractions of the frame (every coordinate within 0..1)."""
    return all(0.0 <= x <= 1.0 and 0.0 <= y <= 1.0 for x, y in points)


def _cross(o: Point, a: Point, b: Point) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def _segments_cross(p1: Point, p2: Point, q1: Point, q2: Point) -> bool:
    """Whether the closed segments p1-p2 and q1-q2 touch or cross."""
    d1, d2 = _cross(q1, q2, p1), _cross(q1, q2, p2)
    d3, d4 = _cross(p1, p2, q1), _cross(p1, p2, q2)
    if ((d1 > 0 > d2) or (d1 < 0 < d2)) and ((d3 > 0 > d4) or (d3 < 0 < d4)):
        return True

    def on(a: Point, b: Point, c: Point, d: float) -> bool:  # c on segment a-b (collinear, within its box)
        return d == 0 and min(a[0], b[0]) <= c[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= c[1] <= max(a[1], b[1])

    return on(q1, q2, p1, d1) or on(q1, q2, p2, d2) or on(p1, p2, q1, d3) or on(p1, p2, q2, d4)


def polygon_problem(points: Sequence[Point], frame: tuple[int, int] | None) -> str | None:
    """What is wrong with a polygon, or None. `frame` (width, height) bounds pixel polygons; without
    it only fractions can be checked, so pixel points need the frame size."""
    if len(points) < 3:
        return "a polygon needs at least 3 points"
    if not is_fraction(points):
        if frame is None:
            return (
                "points in pixels need the frame size: set the pipeline's frame_size [width, height] "
                "(or source width and height), or give the points as fractions 0..1 of the frame"
            )
        width, height = frame
        outside = [p for p in points if not (0 <= p[0] <= width and 0 <= p[1] <= height)]
        if outside:
            return f"point {list(outside[0])} is outside the {width}x{height} frame"
    n = len(points)
    if abs(sum(_cross(points[0], points[i], points[i + 1]) for i in range(1, n - 1))) < 1e-12:
        return "the polygon has no area (its points are on one line)"
    for i in range(n):
        for j in range(i + 1, n):
            if j == i + 1 or (i == 0 and j == n - 1):
                continue  # neighbouring edges share a point
            if _segments_cross(points[i], points[(i + 1) % n], points[j], points[(j + 1) % n]):
                return f"the polygon crosses itself (edge {i + 1} meets edge {j + 1})"
    return None


class Polygon:
    """A checked polygon scaled to a frame of `size` (width, height) pixels."""

    def __init__(self, points: Sequence[Point], size: tuple[int, int], declared: tuple[int, int] | None) -> None:
        width, height = size
        if is_fraction(points):
            sx, sy = float(width), float(height)
        elif declared is not None:  # pixels of the declared frame size; the real frame may differ
            sx, sy = width / declared[0], height / declared[1]
        else:
            sx = sy = 1.0
        self.contour = np.asarray([[x * sx, y * sy] for x, y in points], np.float32).reshape(-1, 1, 2)

    def contains(self, x: float, y: float) -> bool:
        """Whether (x, y) is inside or on the edge."""
        return bool(cv2.pointPolygonTest(self.contour, (float(x), float(y)), measureDist=False) >= 0)

    def fill(self, image: npt.NDArray[np.uint8], value: int, scale: float = 1.0) -> None:
        """Paint the polygon into a single-channel image (a mask), scaled by `scale`."""
        pts = np.round(self.contour * scale).astype(np.int32)
        cv2.fillPoly(image, [pts], value)


REFERENCE_POINTS = ("bottom_center", "center", "top_center")


def reference_point(box: Sequence[float], where: str) -> Point:
    """The point of an [x1, y1, x2, y2] box that decides whether it is in a zone or a mask."""
    x1, y1, x2, y2 = box[:4]
    cx = (x1 + x2) / 2
    if where == "center":
        return cx, (y1 + y2) / 2
    if where == "top_center":
        return cx, y1
    return cx, y2
