"""`sketchwalk frontier` on a tiny model: every (block size, granularity) beside the oracle."""

from __future__ import annotations

import json

import pytest

from sketchwalk.cli.main import main
from sketchwalk.eval.frontier import distance_to_oracle, variant_label


def test_frontier_cells_pair_every_method_with_the_oracle(tiny_model, tmp_path, capsys):
    db = tmp_path / "f.duckdb"
    argv = ["frontier", "--model", tiny_model, "--lengths", "192", "--blocks", "16,32"]
    argv += ["--granularity", "layer,group", "--methods", "sketchwalk,streaming"]
    argv += ["--densities", "0.5", "--sink-blocks", "0", "--window-blocks", "0"]
    argv += ["--dense-layers", "", "--db", str(db), "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    cells = {(r["variant"], r["method"]) for r in rows}
    variants = {"b16 layer", "b16 group", "b32 layer", "b32 group"}
    assert cells == {(v, m) for v in variants for m in ("oracle", "sketchwalk", "streaming")}
    for r in rows:
        assert r["kl_oracle"] is not None and r["kl_mean"] > 0
        assert abs(r["density_achieved"] - 0.5) < 0.1
        if r["method"] == "oracle":
            assert r["kl_gap"] == 0.0
        assert r["config"]["block_size"] == int(r["variant"][1:3])
    from sketchwalk.store import open_store

    with open_store(str(db)) as store:
        stored = store.eval_results()
    assert len(stored) == len(rows) == 12
    assert {variant_label(c) for c in stored["config"]} == variants


def test_distance_to_oracle_is_the_gap_at_the_same_cell():
    base = dict(model_id="m", task="lm", source="s", length=8, density_target=0.2)
    cfg16 = {"block_size": 16, "per_group": True}
    rows = [
        {**base, "method": "oracle", "kl_mean": 0.1, "ppl_sparse": 10.0, "config": cfg16},
        {**base, "method": "sketchwalk", "kl_mean": 0.3, "ppl_sparse": 11.0, "config": cfg16},
        {**base, "method": "sketchwalk", "kl_mean": 0.5, "ppl_sparse": 12.0,
         "config": {"block_size": 32, "per_group": True}},
    ]  # fmt: skip
    out = distance_to_oracle(rows)
    assert out[1]["kl_gap"] == pytest.approx(0.2) and out[1]["ppl_gap_pct"] == pytest.approx(10.0)
    assert out[2]["kl_gap"] is None  # no oracle at block 32


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--granularity", "head"], "unknown granularity"),
        (["--blocks", "24"], "power of two"),
        (["--tasks", "retrieval"], "language modelling"),
        (["--methods", "magic"], "unknown method"),
    ],
)
def test_bad_frontier_input_is_one_line(argv, words, capsys):
    assert main(["frontier", "--no-store", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
