"""`sketchwalk eval` end to end on the tiny model: rows stored, files written, bad input refused."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from sketchwalk.cli.main import main
from sketchwalk.eval import report as eval_report
from sketchwalk.store import open_store


def test_grid_completes_and_writes_the_expected_rows(tiny_model_dir, tmp_path, capsys):
    qa = tmp_path / "qa.jsonl"
    qa.write_text(
        json.dumps({"prompt": "The code is 41234. " * 30 + "The code is", "answer": "41234"}) + "\n"
    )
    db, out = tmp_path / "e.duckdb", tmp_path / "out"
    argv = [
        "eval", "--model", str(tiny_model_dir), "--methods", "sketchwalk,quest",
        "--densities", "0.3,1.0", "--tasks", f"lm,retrieval:passkey,file:{qa}",
        "--lengths", "256", "--max-chunks", "1", "--depths", "0.5", "--block-size", "16",
        "--dense-layers", "0", "--new-tokens", "3", "--window", "0", "--dense-tail-blocks", "0", "--sink-blocks", "0", "--window-blocks", "0", "--db", str(db), "--out", str(out),
        "--no-png", "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    captured = capsys.readouterr()
    printed = json.loads(captured.out)
    assert "100/100" in captured.err  # the grid's Progress fractions drove the bar to the end
    with open_store(str(db)) as store:
        df = store.eval_results()
    # 3 (task, source, length) panels x 2 methods x 2 densities, one eval id
    assert len(df) == len(printed) == 12 and df["eval_id"].nunique() == 1
    assert set(df["task"]) == {"lm", "retrieval", "file"}
    assert set(zip(df["method"], df["density_target"], strict=True)) == {
        (m, d) for m in ("sketchwalk", "quest") for d in (0.3, 1.0)
    }
    assert (df["n_items"] == 1).all()
    full = df[df["density_target"] == 1.0]
    assert (full["kl_mean"] < 1e-6).all() and (full["top1_agreement"] == 1.0).all()
    assert (full["density_achieved"] == 1.0).all()
    sparse = df[df["density_target"] == 0.3]
    assert sparse["density_achieved"].between(0.2, 0.3 + 1e-9).all()  # on target, not forced
    assert (sparse["kl_mean"] > 0).all()
    assert all(json.loads(json.dumps(c))["window"] == 0.0 for c in df["config"])
    answered = df[df["task"] != "lm"]
    assert answered["acc_dense"].notna().all() and answered["density_decode"].notna().all()
    assert (
        full.loc[full["task"] != "lm", "acc_sparse"] == full.loc[full["task"] != "lm", "acc_dense"]
    ).all()
    assert df[df["task"] == "lm"]["acc_dense"].isna().all()
    assert {p.name for p in out.iterdir()} == {
        "table.txt", "results.json", "results.parquet", "quality.html"
    }  # fmt: skip
    assert pq.read_table(out / "results.parquet").num_rows == 12
    html = (out / "quality.html").read_text()
    assert html.count("plotly-graph-div") >= 3 and "gpl-3" in html and "256 tokens" in html
    table = eval_report.format_table(printed)
    assert "quest" in table and "acc_s" in table and "select" in table.splitlines()[0]
    # every sparse cell timed its selection against the dense model's attention, prefill and decode
    assert all(eval_report.selection_share(r) > 0 for r in sparse.to_dict("records"))


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--methods", "sketchwalk,magic"], "unknown method 'magic'"),
        (["--methods", "dense"], "dense is the reference"),
        (["--densities", "0,0.2"], "--densities values must be in (0, 1]"),
        (["--densities", "a"], "comma-separated numbers"),
        (["--lengths", "-5"], "--lengths values must be in 1..2097152, got -5"),
        (["--tasks", "speed"], "unknown task"),
        (["--depths", "1.5"], "--depths values must be in [0, 1]"),
        (["--block-size", "48"], "power of two"),
        (["--lengths", "99999"], "exceeds"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir, tmp_path, capsys, extra, words):
    argv = ["eval", "--model", str(tiny_model_dir), "--no-store", "--out", str(tmp_path / "o")]
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_report_helpers():
    rows = [
        dict(task="lm", source="s", length=9, method=m, density_target=d, ppl_dense=10.0,
             ppl_sparse=10.0 * (1 + e))
        for m, d, e in [("sketchwalk", 0.1, 0.03), ("sketchwalk", 0.2, 0.009),
                        ("sketchwalk", 0.3, 0.001), ("quest", 0.1, 0.0)]
    ]  # fmt: skip
    assert eval_report.within(rows, "sketchwalk") == {("lm", "s", 9): 0.2}
    assert eval_report.within(rows, "sketchwalk", pct=0.2) == {("lm", "s", 9): 0.3}
    lines = eval_report.format_table(rows).splitlines()
    assert "quest" in lines[-1] and "+3.00" in lines[1] and "acc_s" not in lines[0]
    assert "select" not in lines[0]  # rows without timings (stored before they were kept)
