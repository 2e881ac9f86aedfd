"""benchmarks/gpu_work.py: the estimator's counted GPU work against dense attention follows the
closed form of its two passes (the count itself is checked against the interpreter's trace in
tests/kernels/interp/test_triton_block_mass.py)."""

import json

import pytest

from sketchwalk.benchmarks.gpu_work import main, work_row


@pytest.mark.parametrize("length", [32768, 131072])
def test_the_gpu_presets_estimator_work_is_its_two_passes_over_the_sampled_share(length):
    """gpu preset: 4 of 32 queries scored in a rank-24 basis (32-wide tiles), two passes: the
    exponentials are 2 x 4/32 of dense attention's, the multiply-adds 2 x 4/32 x 32 / (2 x 128);
    tiles past a row block's last query add at most a block's worth."""
    x = work_row("llama3-8b", length, "gpu")
    assert x["exp_share"] == pytest.approx(2 * 4 / 32, rel=0.02)
    assert x["mac_share"] == pytest.approx(2 * 4 / 32 * 32 / 256, rel=0.02)
    assert x["rank"] == 24 and x["sampled_layers"] == 1.0


def test_the_table_and_json_and_a_bad_length(capsys):
    main(["--seq-len", "4096", "--preset", "gpu", "fast"])
    out = capsys.readouterr().out
    assert "block means only" in out and "gpu" in out
    main(["--seq-len", "4096", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert {r["preset"] for r in rows} == {"gpu", "default"}
    with pytest.raises(SystemExit) as exc:
        main(["--seq-len", "0"])
    assert exc.value.code == 2
