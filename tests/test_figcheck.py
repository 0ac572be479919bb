"""The figure check finds each way a figure misleads (and passes the fixed figure)."""

import json

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import plotly.io as pio

from labkit.docs.figcheck import problems


def _fig(f) -> dict:
    return json.loads(pio.to_json(f))


EVALS = pd.DataFrame({"method": ["grpo", "grpo", "didpo", "didpo"], "step": [0, 2, 0, 2],
                      "pass@1": [0.125, 0.156, 0.125, 0.156]})


def test_a_numeric_step_on_a_continuous_colour_scale_is_caught_and_a_string_one_passes():
    bad = problems(_fig(px.bar(EVALS, x="method", y="pass@1", color="step", barmode="group")))
    assert any("continuous scale" in p for p in bad) and any("'step'" in p for p in bad)
    good = EVALS.assign(step=EVALS["step"].map(lambda s: f"step {s}"))
    assert problems(_fig(px.bar(good, x="method", y="pass@1", color="step", barmode="group"))) == []


def test_identical_traces_drawn_alike_are_caught_unless_dashed_or_named():
    same = pd.DataFrame({"step": [1, 2] * 2, "r": [0.1, 0.2] * 2, "method": ["raw"] * 2 + ["reshaped"] * 2})
    assert any("hides the other" in p for p in problems(_fig(px.line(same, x="step", y="r", color="method"))))
    assert problems(_fig(px.line(same, x="step", y="r", color="method", line_dash="method"))) == []
    named = go.Figure([go.Scatter(x=[1, 2], y=[0.1, 0.2], name="raw"),
                       go.Scatter(x=[1, 2], y=[0.1, 0.2], name="reshaped (identical to raw)")])
    named.update_layout(xaxis_title="step", yaxis_title="reward")
    assert problems(_fig(named)) == []


def test_placeholder_and_missing_axis_titles_are_caught():
    wide = pd.DataFrame({"raw": [0.0, 1.0], "default": [0.1, 0.9], "trap": [0.5, 0.9]})
    found = problems(_fig(px.scatter(wide, x="raw", y=["default", "trap"])))
    assert found == ["no y axis says what it shows (titles: ['value'])"]
    bare = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]))
    assert len(problems(_fig(bare))) == 2
    titled = px.scatter(wide, x="raw", y=["default", "trap"], labels={"value": "composite reward"})
    assert problems(_fig(titled)) == []


def test_numeric_colour_on_bars_at_distinct_x_and_identical_grouped_bars_pass():
    """A measured quantity may colour bars that do not share x positions; grouped bars of
    equal height stand side by side (only overlaid bars hide each other)."""
    per_sample = pd.DataFrame({"sample": [0, 1, 2], "A": [1.2, -0.6, -0.6], "reward": [1.0, 0.0, 0.0]})
    assert problems(_fig(px.bar(per_sample, x="sample", y="A", color="reward"))) == []
    equal = pd.DataFrame({"method": ["grpo", "grpo"], "pass@1": [0.5, 0.5], "when": ["start", "end"]})
    assert problems(_fig(px.bar(equal, x="method", y="pass@1", color="when", barmode="group"))) == []
    assert any("hides" in p for p in
               problems(_fig(px.bar(equal, x="method", y="pass@1", color="when", barmode="overlay"))))
