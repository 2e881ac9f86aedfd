"""Pure functions from store data (numpy arrays, DataFrames) to plotly figures, one module per
kind of chart: common (labels, palettes), heatmaps, masks, curves, depth, tokens, speed, preview,
needle, diff, drill (a bad token's cause), tiles, layer_data.

No Streamlit here, so every figure is unit-tested on plain inputs. Pages import the package and
call `figures.<name>`; the names below stay importable from here.
"""

from sketchwalk.app.figures.common import (
    HOUSE_COLOURWAY,
    LOG_FLOOR,
    MATRIX_TITLES,
    OKABE_ITO,
    PALETTES,
    block_labels,
    escape_text,
)
from sketchwalk.app.figures.curves import CURVES, layer_curves
from sketchwalk.app.figures.depth import depth_figures, depth_matrices
from sketchwalk.app.figures.diff import MaskDiff, diff_curves, diff_figure, mask_diff
from sketchwalk.app.figures.drill import (
    dropped_figure,
    dropped_table,
    outline_row,
    top_sources_figure,
)
from sketchwalk.app.figures.heatmaps import (
    data_figures,
    heatmap_figure,
    layer_figures,
    log_values,
    mask_view_figure,
)
from sketchwalk.app.figures.layer_data import LayerData, layer_data
from sketchwalk.app.figures.masks import (
    causal_mask,
    find_misses,
    kept_density,
    mask_figure,
    mass_recall,
)
from sketchwalk.app.figures.needle import needle_strip, outline_blocks
from sketchwalk.app.figures.preview import (
    PreviewBasis,
    layer_target,
    method_scores,
    preview_basis,
    preview_selection,
    selection_rule,
)
from sketchwalk.app.figures.speed import (
    STAGES,
    overall_speedup,
    speedups,
    stage_figure,
    sweep_figure,
)
from sketchwalk.app.figures.tiles import MAX_SIDE, View, aggregate, plan_view, view_labels
from sketchwalk.app.figures.tokens import (
    decode_figure,
    kl_strip,
    strip_span,
    token_choice_labels,
    token_table,
    worst_tokens,
)

__all__ = [
    "CURVES",
    "HOUSE_COLOURWAY",
    "LayerData",
    "LOG_FLOOR",
    "MAX_SIDE",
    "MaskDiff",
    "MATRIX_TITLES",
    "OKABE_ITO",
    "PALETTES",
    "STAGES",
    "View",
    "aggregate",
    "block_labels",
    "causal_mask",
    "data_figures",
    "decode_figure",
    "depth_figures",
    "depth_matrices",
    "diff_curves",
    "diff_figure",
    "dropped_figure",
    "dropped_table",
    "escape_text",
    "find_misses",
    "heatmap_figure",
    "kept_density",
    "layer_target",
    "kl_strip",
    "layer_curves",
    "layer_data",
    "layer_figures",
    "log_values",
    "mask_diff",
    "mask_figure",
    "mask_view_figure",
    "mass_recall",
    "method_scores",
    "needle_strip",
    "outline_blocks",
    "outline_row",
    "overall_speedup",
    "plan_view",
    "preview_selection",
    "preview_basis",
    "PreviewBasis",
    "selection_rule",
    "speedups",
    "stage_figure",
    "strip_span",
    "sweep_figure",
    "token_choice_labels",
    "token_table",
    "top_sources_figure",
    "view_labels",
    "worst_tokens",
]
