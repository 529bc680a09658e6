"""probe --attribution-plot: the figure of the JSON ``attribution`` section with k3 values that
are not finite (``null``, NaN, inf), and its labels laid out clear of the panel's title.
Sections built in code; the figure is kept open by catching ``plt.close``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from precision_plugin.probe.attribution import RolloutSettings
from precision_plugin.probe.attribution.plot import plot_attribution

plt = pytest.importorskip("matplotlib.pyplot")

#: The texts the figure marks a k3 that is not a finite number with.
NOT_FINITE = {"inf", "undefined", "not finite"}


def _row(k3: Any, share: Any, *, in_total: bool = True, tokens: int = 6) -> dict[str, Any]:
    high = k3 * 1.5 if isinstance(k3, float) and math.isfinite(k3) else None
    return {
        "in_total": in_total,
        "k3": k3,
        "k3_interval": [0.0, high],
        "part": 1.0,
        "share": share if in_total else None,
        "bitwise_equal": 0.5,
        "tokens": tokens,
    }


def _section(**rows: dict[str, Any]) -> dict[str, Any]:
    """A float32 block and a float16 block whose ``rows`` override the float16 defaults (shares
    add up to 1 with a zero interaction and residual, as a default rollout's do)."""
    fp16 = {
        "dtype": _row(2e-5, 0.6),
        "decode": _row(1e-5, 0.3),
        "batch": _row(5e-6, 0.1),
        "lm_head": _row(1.5e-6, None, in_total=False),
        "rope": _row(2.4e-5, None, in_total=False),
        "kv_cache": _row(2.2e-2, None, in_total=False),
        "stale_weights": _row(1.3e-4, None, in_total=False),
    }
    fp16.update(rows)

    def block(causes: dict[str, Any]) -> dict[str, Any]:
        return {
            "total": {"k3": 1.9e-5, "k3_interval": [1.6e-5, 2.3e-5], "part": 1.0, "tokens": 6},
            "causes": causes,
            "interaction": {"part": 0.0, "share": 0.0},
            "residual": {"part": 0.0, "share": 0.0},
        }

    return {
        "rollout": RolloutSettings().to_dict(),
        "dtypes": {
            "float32": block({"dtype": _row(0.0, 0.0), "decode": _row(1e-11, 1.0)}),
            "float16": block(fp16),
        },
    }


def _draw(section: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Draw ``section`` to a PNG and return the figure, kept open."""
    figures: list[Any] = []
    monkeypatch.setattr(plt, "close", figures.append)
    out = plot_attribution(section, tmp_path / "a.png")
    monkeypatch.undo()
    assert out.stat().st_size > 0 and len(figures) == 1
    return figures[0]


def test_an_infinite_or_undefined_k3_is_marked_in_the_right_panel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A what-if row whose k3 is ``null`` (a log-ratio past 709 nats), NaN or inf drew no bar,
    so it read as negligible; each gets a marker and a label at its own bar's place."""
    section = _section(
        lm_head=_row(None, None, in_total=False),  # null with tokens: an overflowed k3
        rope=_row(math.nan, None, in_total=False),
        stale_weights=_row(math.inf, None, in_total=False),
    )
    fig = _draw(section, tmp_path, monkeypatch)
    try:
        right = fig.axes[1]
        # float16 is the only dtype drawn (float32 is left out): its bars sit on the ticks.
        ticks = dict(
            zip([t.get_text() for t in right.get_xticklabels()], right.get_xticks(), strict=True)
        )
        labelled = sorted(
            (t.get_position()[0], t.get_text()) for t in right.texts if t.get_text() in NOT_FINITE
        )
        assert labelled == [
            (ticks["lm_head"], "inf"),
            (ticks["rope"], "undefined"),
            (ticks["stale_weights"], "inf"),
        ], labelled
        markers = [line.get_xdata()[0] for line in right.get_lines() if line.get_marker() == "^"]
        assert sorted(markers) == [ticks["lm_head"], ticks["rope"], ticks["stale_weights"]]
        assert "not finite" in right.get_xlabel()
    finally:
        plt.close(fig)


def test_a_section_with_null_nan_and_inf_numbers_draws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``total.k3`` null raised a TypeError at the ``k3 {:.2g}`` label; every number that is
    not finite now draws, labelled so."""
    section = _section(
        dtype=_row(None, math.inf),
        decode=_row(math.nan, math.nan),
        batch=_row(math.inf, None),
    )
    fp16 = section["dtypes"]["float16"]
    fp16["total"].update(k3=None, k3_interval=[None, None], part=math.nan)
    fp16["interaction"] = {"part": math.nan, "share": math.nan}
    fp16["residual"] = {"part": math.inf, "share": -math.inf}
    section["dtypes"]["bfloat16"] = {
        **section["dtypes"]["float32"],
        "total": {"k3": math.nan, "k3_interval": [None, None], "part": 0.0, "tokens": 0},
    }
    fig = _draw(section, tmp_path, monkeypatch)
    try:
        labels = [t.get_text() for t in fig.axes[0].texts]
        assert labels == ["k3 not finite\nshares not finite", "k3 undefined"], labels
    finally:
        plt.close(fig)


@pytest.mark.parametrize("residual", [0.0, 0.5, -0.5])
def test_the_k3_labels_clear_the_title_and_the_bars(
    residual: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``k3 ...`` label over each bar overlapped the left panel's title (drawn at share 1,
    the top of a bar whose shares add up to 100 %); it stays inside the panel, above the bars
    and below the title, however tall the bar."""
    section = _section()
    section["dtypes"]["float16"]["residual"] = {"part": residual, "share": residual}
    section["dtypes"]["bfloat16"] = section["dtypes"]["float16"]
    fig = _draw(section, tmp_path, monkeypatch)
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        left = fig.axes[0]
        title = left.title.get_window_extent(renderer)
        panel = left.get_window_extent(renderer)
        bars = [p.get_window_extent(renderer) for p in left.patches]
        assert len(left.texts) == 2 and bars
        for text in left.texts:
            box = text.get_window_extent(renderer)
            assert not box.overlaps(title), (text.get_text(), box, title)
            assert panel.x0 <= box.x0 and box.x1 <= panel.x1, (box, panel)
            assert panel.y0 <= box.y0 and box.y1 <= panel.y1, (box, panel)
            assert all(not box.overlaps(bar) for bar in bars), box
    finally:
        plt.close(fig)
