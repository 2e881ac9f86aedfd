"""The decode-fidelity benchmark's re-select rules: parsed and checked before a model loads."""

import pytest

from sketchwalk.benchmarks.decode_fidelity import main, with_rule
from sketchwalk.engine.method.config import SketchWalkConfig


def test_rules_set_the_reselect_knobs():
    cfg = SketchWalkConfig()
    assert with_rule(cfg, "4").decode_reselect == 4
    assert with_rule(cfg, "4").decode_reselect_span == cfg.decode_reselect_span
    ruled = with_rule(cfg, "0:0")
    assert (ruled.decode_reselect, ruled.decode_reselect_span) == (0, 0)
    assert ruled.decode_stagger == cfg.decode_stagger
    flat = with_rule(cfg, "0:512:0")
    assert (flat.decode_reselect, flat.decode_reselect_span, flat.decode_stagger) == (0, 512, False)
    fewer = with_rule(cfg, "0+query_samples=2+tau=0.5")
    assert (fewer.decode_reselect, fewer.query_samples, fewer.tau) == (0, 2, 0.5)
    assert fewer.block_size == cfg.block_size


@pytest.mark.parametrize(
    "bad",
    [
        "x",
        "4:",
        "4:y",
        "-1",
        "1:-5",
        "0:512:2",
        "0:512:",
        "0:1:1:1",
        "0+",
        "0+query_samples",
        "0+nope=1",
        "0+query_samples=-3",
    ],
)
def test_bad_rules_are_one_line_errors_before_the_model_loads(bad, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--rules", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--rules" in err[-1] and "Traceback" not in "".join(err)
