"""The figures' shared pieces: matplotlib's object API on the Agg canvas (no pyplot state, safe from any
thread, no display), imported only when a figure is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def warm_up_figures() -> None:
    """Import matplotlib now (most of a second), e.g. while waiting for another process."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    from matplotlib.figure import Figure  # noqa: F401
    from matplotlib.ticker import FuncFormatter  # noqa: F401


def figure(width: float = 6.0, height: float = 4.0) -> tuple[Any, Any]:
    # matplotlib takes most of a second to import: only an evaluation that draws figures pays for it
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def thousands(axis: Any) -> None:
    """Token axes read 2k, 4k, … instead of colliding 10000-style labels."""
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1000:.3g}k" if abs(v) >= 1000 else f"{v:.0f}"))


def save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, format="png")
