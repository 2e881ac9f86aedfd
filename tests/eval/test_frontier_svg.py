"""eval/frontier_svg.py: frontier rows drawn as KL against selection share, the oracle a line."""

import json
import re

import pytest

from sketchwalk.eval.frontier_svg import frontier_svg, knob_label, main


def _row(method, kl, share, **knobs):
    return {"method": method, "kl_mean": kl, "selection_share": share, "config": knobs}


ROWS = [
    _row("oracle", 0.044, 0.05),
    _row("sketchwalk", 0.045, 0.30),
    _row("sketchwalk", 0.063, 0.18, block_size=32, query_samples=4, score_rank=24),
    _row("streaming", 0.099, 0.05),
]


def test_knob_labels_name_what_differs_from_the_defaults():
    assert knob_label({}) == "defaults"
    assert knob_label({"query_samples": 8}) == "defaults"  # the default's own value
    assert knob_label({"block_size": 32, "query_samples": 4, "pool": "mean"}) == "b32 q4 mean"


def test_points_sit_where_their_numbers_say_and_the_oracle_is_a_line():
    svg = frontier_svg(ROWS, title="GPL-3 2k")
    circles = [(float(x), float(y)) for x, y in re.findall(r'cx="([\d.]+)" cy="([\d.]+)"', svg)]
    assert len(circles) == 3  # the oracle is not a point
    by_x = sorted(circles)
    # more selection share: further right; more KL: higher up (smaller y)
    streaming, lean, defaults = by_x
    assert streaming[1] < lean[1] < defaults[1]
    assert "exact-mass oracle KL 0.0440" in svg
    # numbered by KL in the legend, each with its KL and share
    assert "1. defaults (0.0450, 30%)" in svg and "2. b32 q4 rank 24 (0.0630, 18%)" in svg
    assert "3. streaming (0.0990, 5%)" in svg
    assert "GPL-3 2k" in svg


def test_nothing_to_draw_and_bad_files_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(ValueError, match="no frontier rows"):
        frontier_svg([_row("oracle", 0.04, 0.1)])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "rows"}))
    with pytest.raises(SystemExit) as exc:
        main([str(bad), "--out", str(tmp_path / "x.svg")])
    assert exc.value.code == 2 and "not a list of frontier rows" in capsys.readouterr().err
    assert not (tmp_path / "x.svg").exists()
    good = tmp_path / "good.json"
    good.write_text(json.dumps(ROWS))
    main([str(good), "--out", str(tmp_path / "y.svg")])
    assert (tmp_path / "y.svg").read_text().startswith("<svg")
