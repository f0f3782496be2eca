"""Synthetic camera-like frames showing one printed digit, for the bundled demo model and sample video.

Everything is drawn locally with OpenCV; nothing is downloaded. Glyphs come from every Hershey font
constant OpenCV has (upright and italic) through `cv2.putText`, plus a small built-in single-stroke digit
font (`STROKE_FONT`) so that thin vector-style digits are covered whatever `putText` renders: OpenCV 5
draws the Hershey constants with one built-in variable-weight sans font and ignores FONT_ITALIC, so a
random shear stands in for italics as well. Frames are BGR uint8, as `cv2.VideoCapture` delivers them.

`render_frame` draws one independent frame. The video maker holds one `DigitStyle` for several frames
and varies it a little with `jitter`, drawing each with `draw`.

scripts/ is not a package: the other scripts import this module after putting their own folder on
`sys.path`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

Frame = npt.NDArray[np.uint8]

HERSHEY_FONTS: tuple[int, ...] = (
    cv2.FONT_HERSHEY_SIMPLEX,
    cv2.FONT_HERSHEY_PLAIN,
    cv2.FONT_HERSHEY_DUPLEX,
    cv2.FONT_HERSHEY_COMPLEX,
    cv2.FONT_HERSHEY_TRIPLEX,
    cv2.FONT_HERSHEY_COMPLEX_SMALL,
    cv2.FONT_HERSHEY_SCRIPT_SIMPLEX,
    cv2.FONT_HERSHEY_SCRIPT_COMPLEX,
)
STROKE_FONT = -1  # the built-in single-stroke digits below
#: Every Hershey font OpenCV has, upright and italic, and the stroke font (listed twice: 1 draw in 9).
FONTS: tuple[int, ...] = (
    *HERSHEY_FONTS,
    *(f | cv2.FONT_ITALIC for f in HERSHEY_FONTS),
    STROKE_FONT,
    STROKE_FONT,
)

MAX_ANGLE_DEG = 15.0  # beyond this a 6 starts to pass for a 9
MAX_SHEAR = 0.3  # italic slant, as dx/dy
MIN_CONTRAST = 70.0  # luma difference between digit and every background colour
_LUMA = np.array([0.114, 0.587, 0.299])  # BGR weights


@dataclass(frozen=True)
class DigitStyle:
    """Everything that decides how one digit frame looks, except the per-frame sensor noise."""

    digit: int
    width: int
    height: int
    font: int  # a Hershey constant (maybe | FONT_ITALIC) or STROKE_FONT
    variant: int  # alternate shapes of the stroke font
    glyph_height: float  # pixels, of the digit's ink before the affine transform
    stroke: int  # line thickness (putText thickness / polyline width)
    aspect: float  # horizontal stretch of the glyph
    shear: float  # italic slant, positive leans right
    angle: float  # degrees, counter-clockwise
    cx: float  # where the glyph's centre lands
    cy: float
    fg: tuple[int, int, int]  # BGR
    bg_seed: int  # the background (gradient + clutter) is drawn from this seed
    noise_sigma: float
    blur_sigma: float  # 0 = no blur
    jpeg_quality: int  # 0 = no compression round trip


def _luma(color: npt.ArrayLike) -> float:
    return float(np.dot(np.asarray(color, dtype=np.float64), _LUMA))


def _random_color(rng: np.random.Generator) -> tuple[int, int, int]:
    b, g, r = (int(v) for v in rng.integers(0, 256, size=3))
    return (b, g, r)


def _contrasting_color(rng: np.random.Generator, against: list[float]) -> tuple[int, int, int]:
    """A colour whose luma differs by MIN_CONTRAST from every luma in `against` (tries, then falls back)."""
    for _ in range(50):
        color = _random_color(rng)
        if all(abs(_luma(color) - y) >= MIN_CONTRAST for y in against):
            return color
    # backgrounds are drawn to leave room at one end of the range, so black or white always works
    return (0, 0, 0) if min(against) >= MIN_CONTRAST else (255, 255, 255)


Point = tuple[float, float]
Strokes = list[list[Point]]


def _arc(centre: Point, radii: Point, a0: float, a1: float) -> list[Point]:
    """Points along an elliptic arc, angles in degrees (0 = right, 90 = down, as in image coordinates)."""
    (cx, cy), (rx, ry) = centre, radii
    n = max(4, int(abs(a1 - a0) / 10))
    return [
        (cx + rx * math.cos(math.radians(a)), cy + ry * math.sin(math.radians(a))) for a in np.linspace(a0, a1, n + 1)
    ]


def _turned(strokes: Strokes) -> Strokes:
    """The glyph rotated by 180 degrees inside its 0.6 x 1.0 box."""
    return [[(0.6 - x, 1.0 - y) for x, y in line] for line in strokes]


def _stroke_font() -> dict[int, tuple[Strokes, Strokes]]:
    """A simple single-stroke digit font: two shapes per digit, polylines in a 0.6 x 1.0 box (y down)."""
    zero = [_arc((0.3, 0.5), (0.3, 0.5), 0, 360)]
    one = [[(0.12, 0.22), (0.34, 0.0), (0.34, 1.0)]]
    two = [[*_arc((0.3, 0.28), (0.28, 0.28), 195, 380), (0.0, 1.0), (0.6, 1.0)]]
    six_loop = _arc((0.3, 0.7), (0.28, 0.3), 0, 360)
    six = [_arc((0.56, 0.7), (0.54, 0.7), 262, 180), six_loop]
    six_straight = [[(0.45, 0.0), (0.04, 0.62)], six_loop]
    seven = [[(0.0, 0.0), (0.6, 0.0), (0.18, 1.0)]]
    return {
        0: (zero, [_arc((0.3, 0.5), (0.3, 0.5), 0, 360), [(0.48, 0.15), (0.12, 0.85)]]),
        1: (one, [*one, [(0.12, 1.0), (0.56, 1.0)]]),
        2: (two, [[*_arc((0.3, 0.3), (0.3, 0.3), 180, 360), (0.0, 1.0), (0.6, 1.0)]]),
        3: (
            [[*_arc((0.3, 0.25), (0.26, 0.25), 200, 450), *_arc((0.3, 0.75), (0.3, 0.25), 270, 520)]],
            [[(0.04, 0.0), (0.56, 0.0), (0.24, 0.4), *_arc((0.3, 0.7), (0.3, 0.3), 255, 500)]],
        ),
        4: (
            [[(0.45, 1.0), (0.45, 0.0), (0.0, 0.7), (0.6, 0.7)]],
            [[(0.2, 0.0), (0.0, 0.68), (0.6, 0.68)], [(0.45, 0.35), (0.45, 1.0)]],
        ),
        5: (
            [[(0.55, 0.0), (0.1, 0.0), (0.06, 0.46), *_arc((0.3, 0.68), (0.3, 0.32), 222, 490)]],
            [[(0.55, 0.0), (0.08, 0.0), (0.08, 0.42), *_arc((0.28, 0.7), (0.32, 0.3), 235, 480)]],
        ),
        6: (six, six_straight),
        7: (seven, [*seven, [(0.14, 0.52), (0.5, 0.52)]]),
        8: (
            [_arc((0.3, 0.25), (0.24, 0.25), 0, 360), _arc((0.3, 0.73), (0.3, 0.27), 0, 360)],
            [_arc((0.3, 0.27), (0.27, 0.27), 0, 360), _arc((0.3, 0.77), (0.27, 0.23), 0, 360)],
        ),
        9: (_turned(six), _turned(six_straight)),
    }


_STROKE_GLYPHS = _stroke_font()


def _crop(canvas: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    ys, xs = np.nonzero(canvas)
    crop = canvas[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    return crop.astype(np.float32) / 255.0


def _glyph_mask(digit: int, font: int, variant: int, glyph_height: float, stroke: int) -> npt.NDArray[np.float32]:
    """Anti-aliased ink of one digit (0..1), cropped to its bounding box."""
    margin = stroke + 4
    if font == STROKE_FONT:
        shift = 4  # sub-pixel coordinates for polylines
        w, h = round(0.6 * glyph_height), round(glyph_height)
        canvas = np.zeros((h + 2 * margin, w + 2 * margin), dtype=np.uint8)
        lines = [
            (np.array([(margin + x * w, margin + y * h) for x, y in line]) * (1 << shift)).astype(np.int32)
            for line in _STROKE_GLYPHS[digit][variant % 2]
        ]
        cv2.polylines(canvas, lines, False, 255, stroke, cv2.LINE_AA, shift)
        return _crop(canvas)
    text = str(digit)
    (_, h1), _ = cv2.getTextSize(text, font, 1.0, 1)
    scale = glyph_height / max(h1, 1)
    (tw, th), base = cv2.getTextSize(text, font, scale, stroke)
    canvas = np.zeros((th + base + 2 * margin, tw + 2 * margin), dtype=np.uint8)
    cv2.putText(canvas, text, (margin, margin + th), font, scale, 255, stroke, cv2.LINE_AA)
    return _crop(canvas)


@dataclass(frozen=True)
class _Clutter:
    kind: int  # 0 line, 1 filled rectangle, 2 filled circle, 3 blotchy texture
    color: tuple[float, float, float]
    p: tuple[int, int]
    q: tuple[int, int]  # line end / rectangle corner; (radius, 0) for a circle
    thickness: int
    speckle: npt.NDArray[np.float32] | None
    alpha: float


@dataclass(frozen=True)
class _Background:
    c0: npt.NDArray[np.float32]
    c1: npt.NDArray[np.float32]
    theta: float
    clutter: list[_Clutter]
    lumas: list[float]  # the colours the digit must stand out from


def _plan_background(style: DigitStyle) -> _Background:
    """Draw the background's random parameters from `style.bg_seed` (cheap; no pixels yet)."""
    rng = np.random.default_rng(style.bg_seed)
    w, h = style.width, style.height
    dark = rng.random() < 0.5  # leave room for a contrasting digit at the other end of the range
    lo, hi = (0, 150) if dark else (105, 256)
    c0 = rng.integers(lo, hi, size=3).astype(np.float32)
    c1 = np.clip(c0 + rng.normal(0, 35, size=3), lo, hi - 1).astype(np.float32)
    theta = float(rng.uniform(0, 2 * math.pi))
    lumas = [_luma(c0), _luma(c1)]
    clutter = []
    for _ in range(int(rng.integers(0, 7))):
        base = c0 if rng.random() < 0.5 else c1
        shade = np.clip(base + rng.normal(0, 30, size=3), lo, hi - 1)
        kind = int(rng.integers(0, 4))
        p = (int(rng.integers(-10, w + 10)), int(rng.integers(-10, h + 10)))
        q, thickness, speckle = (0, 0), 1, None
        if kind == 0:
            q = (int(rng.integers(-10, w + 10)), int(rng.integers(-10, h + 10)))
            thickness = int(rng.integers(1, 3))
        elif kind == 1:
            q = (p[0] + int(rng.integers(10, 60)), p[1] + int(rng.integers(10, 50)))
        elif kind == 2:
            q = (int(rng.integers(8, 40)), 0)
        else:
            speckle = rng.normal(0, 18, size=(h // 8 + 1, w // 8 + 1, 3)).astype(np.float32)
        color = (float(shade[0]), float(shade[1]), float(shade[2]))
        clutter.append(_Clutter(kind, color, p, q, thickness, speckle, float(rng.uniform(0.15, 0.5))))
        lumas.append(_luma(shade))
    return _Background(c0, c1, theta, clutter, lumas)


def _render_background(plan: _Background, width: int, height: int) -> npt.NDArray[np.float32]:
    """Gradient plus low-contrast clutter, float32 BGR."""
    xs = (np.arange(width, dtype=np.float32) - width / 2) * math.cos(plan.theta)
    ys = (np.arange(height, dtype=np.float32) - height / 2) * math.sin(plan.theta)
    t = ys[:, None] + xs[None, :]
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    img = np.ascontiguousarray(plan.c0 + (plan.c1 - plan.c0) * t[..., None], dtype=np.float32)
    for c in plan.clutter:
        layer = img.copy()
        if c.kind == 0:
            cv2.line(layer, c.p, c.q, c.color, c.thickness, cv2.LINE_AA)
        elif c.kind == 1:
            cv2.rectangle(layer, c.p, c.q, c.color, -1)
        elif c.kind == 2:
            cv2.circle(layer, c.p, c.q[0], c.color, -1, cv2.LINE_AA)
        elif c.speckle is not None:
            layer += cv2.resize(c.speckle, (width, height), interpolation=cv2.INTER_CUBIC)
        img = np.asarray(cv2.addWeighted(img, 1 - c.alpha, layer, c.alpha, 0.0), dtype=np.float32)
    return np.clip(img, 0, 255)


def _linear(style: DigitStyle) -> npt.NDArray[np.float64]:
    """2x2 map glyph -> frame: stretch and slant, then rotate (image coordinates, y down)."""
    a = math.radians(style.angle)
    rot = np.array([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
    return np.asarray(rot @ np.array([[style.aspect, -style.shear], [0.0, 1.0]]), dtype=np.float64)


def _mask(style: DigitStyle) -> npt.NDArray[np.float32]:
    return _glyph_mask(style.digit, style.font, style.variant, style.glyph_height, style.stroke)


def _place(mask: npt.NDArray[np.float32], style: DigitStyle) -> npt.NDArray[np.float32]:
    """Move the transformed glyph mask onto a frame-sized alpha map, its centre at (cx, cy)."""
    mh, mw = mask.shape
    m = np.zeros((2, 3))
    m[:, :2] = _linear(style)
    m[:, 2] = np.array([style.cx, style.cy]) - m[:, :2] @ np.array([(mw - 1) / 2, (mh - 1) / 2])
    out = cv2.warpAffine(mask, m, (style.width, style.height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)
    return np.clip(out, 0.0, 1.0)


def _footprint(style: DigitStyle) -> tuple[float, float]:
    """Half width and half height of the placed glyph's bounding box."""
    mh, mw = _mask(style).shape
    corners = np.array([[-mw, -mh], [mw, -mh], [-mw, mh], [mw, mh]], dtype=np.float64) / 2
    moved = corners @ _linear(style).T
    return float(np.abs(moved[:, 0]).max()), float(np.abs(moved[:, 1]).max())


def _centre_range(half: float, size: int, margin: float) -> tuple[float, float]:
    """Where a centre may go so that a glyph `2 * half` wide stays inside `size` (middle if it cannot)."""
    lo, hi = half + margin, size - half - margin
    return (lo, hi) if lo <= hi else (size / 2, size / 2)


def random_style(rng: np.random.Generator, digit: int, width: int = 128, height: int = 96) -> DigitStyle:
    """Draw a random look for `digit` on a `width` x `height` frame."""
    if not 0 <= digit <= 9:
        raise ValueError(f"digit must be 0..9, got {digit}")
    font = FONTS[int(rng.integers(len(FONTS)))]
    glyph_height = float(rng.uniform(0.32, 0.8) * height)
    if font == STROKE_FONT:
        stroke = int(rng.integers(2, max(2, round(glyph_height / 7)) + 1))
    else:  # OpenCV 4 widens Hershey strokes by this; OpenCV 5 maps it to the font weight
        stroke = int(rng.integers(1, max(1, round(glyph_height / 9)) + 1))
    shear = float(rng.uniform(0.0, MAX_SHEAR)) if rng.random() < 0.4 else float(rng.uniform(-0.08, 0.08))
    style = DigitStyle(
        digit=digit,
        width=width,
        height=height,
        font=font,
        variant=int(rng.integers(2)),
        glyph_height=glyph_height,
        stroke=stroke,
        aspect=float(rng.uniform(0.8, 1.25)),
        shear=shear,
        angle=float(rng.uniform(-MAX_ANGLE_DEG, MAX_ANGLE_DEG)),
        cx=width / 2,
        cy=height / 2,
        fg=(0, 0, 0),
        bg_seed=int(rng.integers(2**63)),
        noise_sigma=float(rng.uniform(0, 10)),
        blur_sigma=float(rng.uniform(0.3, 1.3)) if rng.random() < 0.5 else 0.0,
        jpeg_quality=int(rng.integers(15, 90)) if rng.random() < 0.4 else 0,
    )
    # shrink the glyph until it fits with a little room, then pick a position where it stays whole
    hw, hh = _footprint(style)
    shrink = min(1.0, (width / 2 - 4) / hw, (height / 2 - 4) / hh)
    if shrink < 1.0:
        style = dataclasses.replace(style, glyph_height=style.glyph_height * shrink)
        hw, hh = _footprint(style)
    cx = float(rng.uniform(*_centre_range(hw, width, 2)))
    cy = float(rng.uniform(*_centre_range(hh, height, 2)))
    lumas = _plan_background(style).lumas
    return dataclasses.replace(style, cx=cx, cy=cy, fg=_contrasting_color(rng, lumas))


def jitter(style: DigitStyle, rng: np.random.Generator) -> DigitStyle:
    """The same look moved a little: a few pixels, a degree or two, a few percent of size."""
    moved = dataclasses.replace(
        style,
        angle=float(np.clip(style.angle + rng.normal(0, 1.5), -MAX_ANGLE_DEG, MAX_ANGLE_DEG)),
        glyph_height=style.glyph_height * float(rng.uniform(0.96, 1.04)),
    )
    hw, hh = _footprint(moved)
    if hw > style.width / 2 - 1 or hh > style.height / 2 - 1:  # grew out of the frame: keep the size
        moved = dataclasses.replace(moved, glyph_height=style.glyph_height)
        hw, hh = _footprint(moved)
    cx = float(np.clip(style.cx + rng.normal(0, 2.5), *_centre_range(hw, style.width, 1)))
    cy = float(np.clip(style.cy + rng.normal(0, 2.0), *_centre_range(hh, style.height, 1)))
    return dataclasses.replace(moved, cx=cx, cy=cy)


def draw(style: DigitStyle, rng: np.random.Generator) -> Frame:
    """Render `style` to a BGR uint8 frame; `rng` supplies the sensor noise."""
    bg = _render_background(_plan_background(style), style.width, style.height)
    alpha = _place(_mask(style), style)[..., None]
    img = bg * (1 - alpha) + np.asarray(style.fg, dtype=np.float32) * alpha
    if style.blur_sigma > 0:
        img = cv2.GaussianBlur(img, (0, 0), style.blur_sigma)
    if style.noise_sigma > 0:
        img = img + np.asarray(rng.normal(0.0, style.noise_sigma, size=img.shape), dtype=np.float32)
    frame = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    if style.jpeg_quality > 0:
        ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, style.jpeg_quality])
        if ok:
            frame = np.asarray(cv2.imdecode(buf, cv2.IMREAD_COLOR), dtype=np.uint8)
    return frame


def render_frame(rng: np.random.Generator, digit: int, width: int = 128, height: int = 96) -> Frame:
    """One BGR uint8 frame (height, width, 3) showing `digit` in a random style."""
    return draw(random_style(rng, digit, width, height), rng)


def render_batch(
    seed: int | np.random.SeedSequence, count: int, width: int = 128, height: int = 96
) -> tuple[list[Frame], list[int]]:
    """`count` frames with labels cycling through 0..9 in a shuffled order, fully determined by `seed`."""
    rng = np.random.default_rng(seed)
    labels = [int(d) for d in rng.permutation(np.arange(count) % 10)]
    return [render_frame(rng, d, width, height) for d in labels], labels
