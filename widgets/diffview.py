"""``DiffView``: the buggy code next to the completion, each token coloured by its advantage.

Left: the buggy code, the lines the fix changes marked. Right: the completion, one span
per token (character spans from the record's ``offsets``) on the diverging map of
:mod:`widgets.colors`; hovering a token shows its text, log-prob, advantage and KL (when
given). Optional outlines ``(start, end, label)`` frame character spans of the
completion (DiDPO anchors will use them).
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
from collections.abc import Collection, Iterator, Mapping, Sequence

import ipywidgets as ipw
from traitlets import Float, List, Unicode

from widgets.colors import diverging_color, escape, ink_color, legend_html, symmetric_scale
from widgets.records import describe
from widgets.static import StaticView

Outline = tuple[int, int, str]
"""``(start, end, label)``: characters ``[start, end)`` of the completion."""

PRE_CSS = ("margin:0;padding:6px;font-family:monospace;font-size:12px;line-height:1.5;"
           "white-space:pre-wrap;word-break:break-all;border:1px solid #ddd;background:#fafafa")
CHANGED_BG = "#fde2a6"


# ----------------------------------------------------------------------------- pure helpers


def changed_lines(before: str, after: str) -> set[int]:
    """0-based lines of ``before`` that differ in ``after``: the ones replaced or deleted,
    and the line at which an insertion happens (the last line for an insertion at the end)."""
    old, new = before.splitlines(), after.splitlines()
    marked: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            marked.update(range(i1, i2))
        elif tag == "insert" and old:
            marked.add(min(i1, len(old) - 1))
    return marked


def render_code_html(code: str, marked: Collection[int] = ()) -> str:
    """``code`` as numbered lines in a ``<pre>``, the ``marked`` lines highlighted."""
    lines = []
    for i, line in enumerate(code.splitlines()):
        bg = f"background:{CHANGED_BG};" if i in marked else ""
        cls = "labkit-line labkit-changed" if i in marked else "labkit-line"
        lines.append(f'<div class="{cls}" style="{bg}"><span style="color:#999">{i + 1:>3} </span>'
                     f"{escape(line)}</div>")
    return f'<pre class="labkit-code" style="{PRE_CSS}">{"".join(lines)}</pre>'


def _token_spans(offsets: Sequence[Sequence[int]], n_chars: int) -> list[tuple[int, int, int]]:
    """``(start, end, token)`` in order, clipped to the text and to what earlier tokens
    covered, empty ones dropped: every character belongs to at most one token."""
    spans, pos = [], 0
    for i, (a, b) in enumerate(offsets):
        a, b = max(a, pos), min(b, n_chars)
        if b > a:
            spans.append((a, b, i))
            pos = b
    return spans


def _title(text: str, i: int, values: Sequence[float | None], logprobs: Sequence[float] | None,
           kls: Sequence[float] | None) -> str:
    def at(xs: Sequence | None) -> float | None:
        return xs[i] if xs is not None and i < len(xs) else None

    lines = [f"#{i} {text!r}"]
    for name, v, fmt in (("log-prob", at(logprobs), ".3f"), ("advantage", at(values), "+.3f"),
                         ("KL", at(kls), ".4f")):
        if v is not None:
            lines.append(f"{name} {v:{fmt}}")
    return "\n".join(lines)


def render_tokens_html(completion: str, offsets: Sequence[Sequence[int]],
                       values: Sequence[float | None], logprobs: Sequence[float] | None = None,
                       kls: Sequence[float] | None = None, outlines: Sequence[Outline] = (),
                       scale: float | None = None) -> str:
    """The completion as a ``<pre>``, each token a span coloured by ``values[i]``.

    Every character of ``completion`` appears exactly once, in order, escaped: text that
    no token covers (or that an earlier token already covered) is emitted plain. Outline
    boundaries split tokens into pieces, so outlines may cross tokens and overlap each
    other; a framed piece gets class ``labkit-outline`` and borders on the outline's ends.
    ``scale`` defaults to ``max |values|``.
    """
    n = len(completion)
    scale = scale or symmetric_scale(values)
    spans = _token_spans(offsets, n)
    boxes = [(max(0, s), min(n, e), label) for s, e, label in outlines if min(n, e) > max(0, s)]
    cuts = sorted({0, n, *(x for a, b, _ in spans for x in (a, b)),
                   *(x for s, e, _ in boxes for x in (s, e))})
    pieces, k = [], 0
    for p, q in itertools.pairwise(cuts):
        while k < len(spans) and spans[k][1] <= p:
            k += 1
        style, cls, tip = [], ["labkit-piece"], []
        if k < len(spans) and spans[k][0] <= p:  # inside token spans[k]
            a, b, i = spans[k]
            v = values[i] if i < len(values) else None
            cls.append("labkit-tok")
            style.append(f"background:{diverging_color(v, scale)};color:{ink_color(v, scale)}")
            tip.append(_title(completion[a:b], i, values, logprobs, kls))
        inside = [(s, e, label) for s, e, label in boxes if s <= p and q <= e]
        if inside:
            cls.append("labkit-outline")
            style.append("border-top:2px solid #222;border-bottom:2px solid #222")
            style += ["border-left:2px solid #222" for s, _, _ in inside if s == p][:1]
            style += ["border-right:2px solid #222" for _, e, _ in inside if e == q][:1]
            tip += [f"outline: {label}" for _, _, label in inside]
        attrs = f'class="{" ".join(cls)}"'
        if style:  # a token or an outline: colour or frame, and hover text
            tip_text = escape("\n".join(tip))
            attrs += f' style="{";".join(style)}" title="{tip_text}"'
        pieces.append(f"<span {attrs}>{escape(completion[p:q])}</span>")
    return f'<pre class="labkit-tokens" style="{PRE_CSS}">{"".join(pieces)}</pre>'


def record_traits(record: Mapping) -> dict:
    """The :class:`DiffView` traits of a ``rollouts.jsonl`` record."""
    return {"buggy_code": record.get("buggy_code", ""), "completion": record["completion"],
            "code": record.get("code", ""), "offsets": [list(o) for o in record["offsets"]],
            "values": list(record.get("advantages") or []),
            "logprobs": list(record.get("logprobs") or []), "kls": list(record.get("kls") or []),
            "caption": describe(record)}


# ----------------------------------------------------------------------------- widget


class DiffView(StaticView, ipw.VBox):
    """Buggy code | completion coloured by per-token advantage, with a legend.

    Every trait re-renders the view; set several at once with :meth:`show_record`.
    Empty ``logprobs`` / ``kls`` mean "not available" and are left out of the hover text.
    """

    buggy_code = Unicode("", help="The code to repair (left).")
    completion = Unicode("", help="The model's completion (right).")
    code = Unicode("", help="The code extracted from the completion; diffed with buggy_code.")
    offsets = List(help="[start, end] characters of each completion token.")
    values = List(help="Per-token value that colours the tokens (advantages).")
    logprobs = List(help="Per-token log-probs (hover text).")
    kls = List(help="Per-token KL to the reference (hover text).")
    outlines = List(help="(start, end, label) character spans of the completion to frame.")
    scale = Float(0.0, help="Colour scale |max|; 0 = max |values|.")
    caption = Unicode("", help="A line above the view.")
    value_label = Unicode("advantage", help="What the colours mean (legend).")

    _RENDERED = ("buggy_code", "completion", "code", "offsets", "values", "logprobs", "kls",
                 "outlines", "scale", "caption", "value_label")

    def __init__(self, **traits):
        self._caption = ipw.HTML()
        self._left = ipw.HTML(layout=ipw.Layout(width="50%"))
        self._right = ipw.HTML(layout=ipw.Layout(width="50%"))
        self._legend = ipw.HTML()
        super().__init__(children=[self._caption, ipw.HBox([self._left, self._right]),
                                   self._legend], **traits)
        self.add_class("labkit-diffview")
        self.observe(self._render, names=list(self._RENDERED))
        self._render()

    @classmethod
    def from_record(cls, record: Mapping, **traits) -> DiffView:
        """A view of one ``rollouts.jsonl`` record (``traits`` override, e.g. ``outlines``)."""
        return cls(**{**record_traits(record), **traits})

    def show_record(self, record: Mapping, **traits) -> None:
        """Show another record (one re-render; outlines are cleared unless given)."""
        with self._one_render():
            for name, value in {"outlines": [], **record_traits(record), **traits}.items():
                setattr(self, name, value)

    @contextlib.contextmanager
    def _one_render(self) -> Iterator[None]:
        self.unobserve(self._render, names=list(self._RENDERED))
        try:
            yield
        finally:
            self.observe(self._render, names=list(self._RENDERED))
            self._render()

    def _render(self, _change: Mapping | None = None) -> None:
        scale = self.scale or symmetric_scale(self.values)
        self._caption.value = f"<b>{escape(self.caption)}</b>" if self.caption else ""
        self._left.value = ("<div>buggy code (changed lines marked)</div>"
                            + render_code_html(self.buggy_code,
                                               changed_lines(self.buggy_code, self.code)))
        self._right.value = ("<div>completion (hover a token)</div>"
                             + render_tokens_html(self.completion, self.offsets, self.values,
                                                  self.logprobs or None, self.kls or None,
                                                  [tuple(o) for o in self.outlines], scale))
        self._legend.value = legend_html(scale, self.value_label)
