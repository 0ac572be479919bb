"""Colours for signed per-token values (advantages, KL): a diverging map and its legend.

Blue is negative, white is zero, red is positive. The scale is symmetric,
``[-s, s]`` with ``s = max |v|``, so white always means exactly zero and the two sides
are comparable. Every function here is pure and returns plain strings (CSS colours or
HTML), so it is tested without a browser.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable

RGB = tuple[int, int, int]

NEGATIVE: RGB = (33, 102, 172)
"""Colour of ``-s`` (blue)."""
NEUTRAL: RGB = (255, 255, 255)
"""Colour of ``0`` (white)."""
POSITIVE: RGB = (178, 24, 43)
"""Colour of ``+s`` (red)."""
DARK_INK_BELOW = 0.6
"""Text turns white where ``|v| / s`` is at least this (dark backgrounds)."""


def escape(text: str) -> str:
    """HTML-escape ``text`` for element content and quoted attributes (``& < > " '``)."""
    return html.escape(text, quote=True)


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def symmetric_scale(values: Iterable[float | None]) -> float:
    """``s = max |v|`` over the finite values; 1.0 when there are none or all are 0."""
    s = max((abs(v) for v in values if _finite(v)), default=0.0)
    return s if s > 0 else 1.0


def _rgb(c: RGB) -> str:
    return f"rgb({c[0]}, {c[1]}, {c[2]})"


def _mix(a: RGB, b: RGB, t: float) -> RGB:
    """Linear interpolation ``a + t (b - a)`` per channel, rounded half up."""
    return tuple(int(x + t * (y - x) + 0.5) for x, y in zip(a, b))  # type: ignore[return-value]


def _position(value: float, scale: float) -> float:
    """``value / scale`` clipped to ``[-1, 1]``."""
    return max(-1.0, min(1.0, value / scale))


def diverging_color(value: float | None, scale: float) -> str:
    """CSS colour of ``value`` on ``[-scale, scale]`` (``transparent`` for a missing or
    non-finite value); values beyond the scale take the end colour."""
    if not _finite(value):
        return "transparent"
    t = _position(value, scale)
    return _rgb(_mix(NEUTRAL, POSITIVE if t > 0 else NEGATIVE, abs(t)))


def ink_color(value: float | None, scale: float) -> str:
    """Readable text colour on :func:`diverging_color`'s background."""
    if _finite(value) and abs(_position(value, scale)) >= DARK_INK_BELOW:
        return "white"
    return "inherit"


def plotly_colorscale() -> list[list]:
    """The same map as a plotly colorscale (use with ``zmid=0``)."""
    return [[0.0, _rgb(NEGATIVE)], [0.5, _rgb(NEUTRAL)], [1.0, _rgb(POSITIVE)]]


def legend_html(scale: float, label: str = "advantage") -> str:
    """A gradient bar from ``-scale`` to ``+scale`` with its three ticks and a label."""
    gradient = f"linear-gradient(to right, {_rgb(NEGATIVE)}, {_rgb(NEUTRAL)}, {_rgb(POSITIVE)})"
    return (
        '<div class="labkit-legend" style="display:flex;align-items:center;gap:6px;'
        'font-size:12px">'
        f"<span>{escape(label)}</span>"
        f"<span>{-scale:+.3g}</span>"
        f'<span style="width:160px;height:10px;border:1px solid #999;background:{gradient}">'
        "</span>"
        f"<span>{scale:+.3g}</span>"
        "<span>(0 = white)</span>"
        "</div>"
    )
