"""Figures: one style, one way to save, a manifest of every figure, and a papermill runner.

In a notebook::

    from repro.figures import use_style, save_figure, gantt, scheduler_color, scheduler_label
    use_style()
    fig, ax = plt.subplots()
    ...
    save_figure(fig, "mgwfbp.timeline", output_dir, scale=scale, source="simulated", caption="...")

From the shell: ``python -m repro.figures run --out results`` (``make figures``), ``... index``,
``... list``. Heavy libraries (seaborn, papermill) are imported only when used.
"""

from .manifest import FigureEntry, ManifestError, done_notebooks, load_manifest
from .plots import gantt, scheduler_lines, stacked_bars
from .save import SCALES, SOURCES, figure_stem, save_figure, tag_title
from .style import (KIND_COLORS, SCHEDULER_COLORS, SCHEDULER_LABELS, kind_color, scheduler_color,
                    scheduler_label, scheduler_style, use_style)

__all__ = [
    "use_style", "scheduler_color", "scheduler_label", "scheduler_style", "kind_color", "SCHEDULER_COLORS",
    "SCHEDULER_LABELS", "KIND_COLORS", "save_figure", "tag_title", "figure_stem", "SCALES", "SOURCES",
    "gantt", "scheduler_lines", "stacked_bars", "FigureEntry", "ManifestError", "load_manifest",
    "done_notebooks",
]
