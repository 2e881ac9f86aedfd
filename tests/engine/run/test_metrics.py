import math
import subprocess
import sys

import pytest
import torch

from sketchwalk.engine.run.metrics import PromptComparison, perplexity


def _comparison(t: int, seed: int) -> PromptComparison:
    g = torch.Generator().manual_seed(seed)
    dense = -torch.rand(t, generator=g) * 5
    sparse = dense - torch.randn(t, generator=g).abs() * (torch.rand(t, generator=g) < 0.1)
    return PromptComparison(torch.rand(t, generator=g), dense, sparse, torch.ones(t).bool())


@pytest.mark.parametrize("t, seed", [(1, 0), (700, 1), (1024, 2), (5000, 3), (9000, 4)])
def test_where_lost_splits_the_nll_increase_by_span_and_worst_tokens(t, seed):
    c = _comparison(t, seed)
    d = (c.logprob_dense - c.logprob_sparse).double()
    w = c.where_lost((1, 10, 100))
    # the mean increase is the log of the perplexity ratio
    ratio = perplexity(c.logprob_sparse) / perplexity(c.logprob_dense)
    assert w["total"] == pytest.approx(100 * math.log(ratio), rel=1e-5, abs=1e-9)
    spans = {k: v for k, v in w.items() if k != "total" and not k.startswith("worst")}
    assert sum(spans.values()) == pytest.approx(w["total"], abs=1e-9)
    bounds = [tuple(int(x) for x in k.split("-")) for k in spans]
    assert bounds[0][0] == 0 and bounds[-1][1] == t - 1
    assert all(a[1] + 1 == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    for (lo, hi), v in zip(bounds, spans.values(), strict=True):
        assert v == pytest.approx(100 * float(d[lo : hi + 1].sum()) / t, abs=1e-9)
    for k in (1, 10, 100):
        want = 100 * sum(sorted(d.tolist(), reverse=True)[:k]) / t
        assert w[f"worst {k}"] == pytest.approx(want, abs=1e-9)


def test_prefill_quality_prints_where_the_perplexity_goes(tiny_model, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("The licence grants every user the same freedoms. " * 40)
    out = subprocess.run(
        [sys.executable, "-m", "sketchwalk.eval.prefill_quality", "--model", tiny_model,
         "--text", str(text), "--bytes", "0", "--where", "--config", '{"block_size": 16}'],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = out.strip().splitlines()
    assert "KL" in lines[0] and "ppl" in lines[0]
    assert lines[1].strip().startswith("NLL") and "0-" in lines[1] and "worst 100" in lines[1]


@pytest.mark.parametrize(
    "config, says",
    [
        ('{"sketch_dim": 0}', "sketch dim must be >= 1"),
        ('{"no_such_knob": 1}', "no_such_knob"),
        ('{"density": ', "Expecting value"),
        ("[1]", "must be a JSON object"),
        ('{"preset": "nope"}', "unknown preset"),
    ],
)
def test_prefill_quality_refuses_a_bad_config_in_one_line_before_loading(config, says, tmp_path):
    # --model names nothing loadable: a config error must come first, without loading it
    out = subprocess.run(
        [sys.executable, "-m", "sketchwalk.eval.prefill_quality", "--model", str(tmp_path / "none"),
         "--config", '{"density": 0.2}', "--config", config],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith("prefill_quality: error:") and says in lines[-1]
    assert "Traceback" not in out.stderr
