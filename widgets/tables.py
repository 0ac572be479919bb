"""DataFrames as HTML tables whose signed columns are coloured like the token view."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from widgets.colors import diverging_color, ink_color, symmetric_scale

CELL_CSS = "padding:2px 6px;text-align:right;font-family:monospace;font-size:12px"


def frame_html(frame: pd.DataFrame, signed: Sequence[str] = (),
               bold_rows: Sequence[bool] | None = None, css_class: str = "labkit-table",
               digits: int = 3) -> str:
    """``frame`` as an HTML table (index hidden, floats to ``digits`` places).

    Cells of the ``signed`` columns are coloured on one symmetric scale shared by those
    columns (so ``A grpo`` and ``A rloo`` compare by colour); rows where ``bold_rows`` is
    true are bold.
    """
    signed = [c for c in signed if c in frame.columns]
    scale = symmetric_scale(frame[signed].to_numpy().ravel().tolist()) if signed else 1.0

    def cell(v: object) -> str:
        if not isinstance(v, (int, float)):
            return ""
        return f"background:{diverging_color(float(v), scale)};color:{ink_color(float(v), scale)}"

    styler = (frame.style.hide(axis="index")
              .format(precision=digits, na_rep="")
              .set_table_attributes(f'class="{css_class}" style="border-collapse:collapse"')
              .set_table_styles([{"selector": "td, th", "props": CELL_CSS}]))
    if signed:
        styler = styler.map(cell, subset=signed)
    if bold_rows is not None:
        weights = pd.Series(["font-weight:bold" if b else "" for b in bold_rows], index=frame.index)
        styler = styler.apply(lambda col: weights, axis=0)
    return styler.to_html()
