"""`sketchwalk frontier` on a tiny model: every (block size, granularity) beside the oracle."""

from __future__ import annotations

import json

import pytest

from sketchwalk.cli.main import main
from sketchwalk.eval.frontier import distance_to_oracle, format_frontier, variant_label
from sketchwalk.eval.report import selection_share


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
        # each cell timed its selection against the dense model's attention on the same prompt
        t = r["extra"]["timings"]
        assert t["dense_attention_ms"] > 0 and t["sparse_attention_ms"] > 0
        assert (
            t["selection_ms"] > 0
            and r["selection_share"] == t["selection_ms"] / t["dense_attention_ms"]
        )
    from sketchwalk.store import open_store

    with open_store(str(db)) as store:
        stored = store.eval_results()
    assert len(stored) == len(rows) == 12
    assert {variant_label(c) for c in stored["config"]} == variants
    assert all(selection_share(r) > 0 for r in stored.to_dict("records"))


def test_frontier_runs_xattentions_threshold_beside_its_budgeted_row(tiny_model, capsys):
    """XAttention's own operating point goes through the frontier like any method: its cell
    reports the density its threshold kept (not the target), beside the oracle's and the
    budgeted xattention's at the same blocks."""
    argv = ["frontier", "--model", tiny_model, "--lengths", "384", "--blocks", "16"]
    argv += ["--granularity", "group", "--methods", "xattention,xattention-threshold"]
    argv += ["--densities", "0.2", "--dense-layers", "", "--query-block", "0", "--no-store"]
    argv += [
        "--sink-blocks",
        "0",
        "--window-blocks",
        "0",
    ]  # the budget's; the threshold's are its own
    assert main([*argv, "--json"]) == 0
    rows = {r["method"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"oracle", "xattention", "xattention-threshold"}
    own = rows["xattention-threshold"]
    assert own["kl_oracle"] == rows["oracle"]["kl_mean"] and own["kl_mean"] > 0
    assert abs(rows["xattention"]["density_achieved"] - 0.2) < 0.1
    assert 0.3 < own["density_achieved"] < 1.0  # the random tiny model's attention is flat
    assert own["config"]["method"] == "xattention-threshold"
    assert main(argv) == 0  # the plain table fits the longer method name
    table = capsys.readouterr().out.splitlines()
    line = next(x for x in table if "xattention-threshold" in x)
    assert line.split()[4] == f"{own['density_achieved']:.3f}"  # b16 group, method, target
    assert line.index(" 0.20 ") + 5 == table[0].index("target") + 6  # columns stay aligned


def test_distance_to_oracle_is_the_gap_at_the_same_cell():
    base = dict(model_id="m", task="lm", source="s", length=8, density_target=0.2)
    base.update(density_achieved=0.2, top1_agreement=0.9, ppl_dense=9.0)
    cfg16 = {"block_size": 16, "per_group": True}
    rows = [
        {**base, "method": "oracle", "kl_mean": 0.1, "ppl_sparse": 10.0, "config": cfg16},
        {**base, "method": "sketchwalk", "kl_mean": 0.3, "ppl_sparse": 11.0, "config": cfg16},
        {**base, "method": "sketchwalk", "kl_mean": 0.5, "ppl_sparse": 12.0,
         "config": {"block_size": 32, "per_group": True}},
    ]  # fmt: skip
    rows[1]["extra"] = {"timings": {"dense_attention_ms": 400.0, "selection_ms": 100.0}}
    out = distance_to_oracle(rows)
    assert out[1]["kl_gap"] == pytest.approx(0.2) and out[1]["ppl_gap_pct"] == pytest.approx(10.0)
    assert out[2]["kl_gap"] is None  # no oracle at block 32
    assert out[1]["selection_share"] == pytest.approx(0.25)
    assert out[0]["selection_share"] is None  # a row stored before the timings were kept
    table = format_frontier(rows).splitlines()
    assert table[0].split()[-1] == "selection"
    assert [line.split()[-1] for line in table[1:]] == ["-", "25.0%", "-"]


@pytest.mark.parametrize(
    "timings",
    [{}, {"dense_attention_ms": 0.0, "selection_ms": 5.0}, {"dense_attention_ms": 10.0}],
)
def test_selection_share_is_none_without_a_dense_time_to_divide_by(timings):
    assert selection_share({"extra": {"timings": timings}}) is None
    assert selection_share({"extra": None}) is None


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
