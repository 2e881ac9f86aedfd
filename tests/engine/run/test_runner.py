"""The runner and model loading on real checkpoints: the tiny folder and the default SmolLM2."""

import pytest
import torch

from sketchwalk.engine.method.config import SketchWalkConfig
from sketchwalk.engine.run.models import ModelError, load_model
from sketchwalk.engine.run.runner import PromptError, RunOptions, run
from sketchwalk.errors import SketchWalkError

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_model(str(tiny_model_dir))


def test_run_on_tiny_model_produces_every_record(tiny):
    cfg = SketchWalkConfig(block_size=16, density=0.3, dense_layers=(0,))
    res = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=6))
    n = res.prompt_tokens
    assert n > 64 and res.model_id.endswith("tiny-llama")
    m = res.metrics
    for key in (
        "kl_mean",
        "top1_agreement",
        "ppl_dense",
        "ppl_sparse",
        "density_achieved",
        "gen_kl_mean",
    ):
        assert m[key] is not None and m[key] == m[key], key
    assert 0.3 <= m["density_achieved"] < 1.0 and 0.0 <= m["top1_agreement"] <= 1.0
    phases = {(r.phase, r.layer) for r in res.layers}
    assert {("prefill", layer) for layer in range(4)} <= phases
    assert any(p == "decode" for p, _ in phases)
    prompt_rows = [t for t in res.tokens if t.position < n]
    assert len(prompt_rows) == 2 * n
    gen = [t for t in res.tokens if t.position >= n and t.variant == "sparse"]
    assert len(gen) == 6 and all(t.kl is not None and t.logprob <= 0 for t in gen)
    assert res.blocks[0].start == 0 and res.blocks[-1].end == n + 6
    assert res.timings["sparse_prefill_ms"] > 0 and res.timings["sketch_ms"] > 0
    v = res.versions  # the machine beside the libraries: timings from two CPUs differ
    assert v["isa"] == torch.backends.cpu.get_cpu_capability() and v["cpu"]
    assert v["threads"] == str(torch.get_num_threads()) and v["torch"] == torch.__version__


def test_density_one_run_is_lossless(tiny):
    cfg = SketchWalkConfig(block_size=16, density=1.0, dense_tail_blocks=0, dense_layers=())
    res = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=5, record=False))
    assert res.metrics["kl_mean"] < 1e-6 and res.metrics["top1_agreement"] == 1.0
    assert res.dense_text == res.sparse_text and res.layers == []


@pytest.mark.parametrize(
    "prompt, cfg, opts, words",
    [
        ("", SketchWalkConfig(), RunOptions(), "empty"),
        (
            PROMPT,
            SketchWalkConfig(block_size=16),
            RunOptions(max_prompt_tokens=50),
            "exceeds the limit",
        ),
    ],
)
def test_bad_prompts_are_refused_before_any_work(tiny, prompt, cfg, opts, words):
    with pytest.raises(PromptError, match=words):
        run(tiny, prompt, cfg, opts)


def test_model_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="cannot load model") as e:
        load_model("no-such-org/no-such-model")
    assert "\n" not in str(e.value)
    with pytest.raises(ModelError, match="no config.json"):
        load_model(str(tmp_path))
    with pytest.raises(SketchWalkError, match="dtype"):
        load_model("smollm2", dtype="int3")


@pytest.mark.slow
def test_default_model_at_density_one_equals_dense():
    """The real SmolLM2 (GQA 9/3 heads): identical logits and greedy text at density 1.0."""
    lm = load_model()
    assert lm.model_id == "smollm2" and lm.max_context == 8192 and len(lm.model_hash) == 64
    with open("/usr/share/common-licenses/GPL-3") as f:
        text = f.read()[:3000]
    cfg = SketchWalkConfig(density=1.0, dense_tail_blocks=0, dense_layers=())
    res = run(lm, text, cfg, RunOptions(max_new_tokens=8, record=False))
    assert res.metrics["kl_mean"] < 1e-6 and res.metrics["top1_agreement"] == 1.0
    assert res.dense_text == res.sparse_text
    cfg = SketchWalkConfig(density=0.2, dense_tail_blocks=1)
    sparse = run(lm, text, cfg, RunOptions(max_new_tokens=8, record=False))
    assert sparse.metrics["density_achieved"] < 0.6 and sparse.metrics["top1_agreement"] > 0.5
    assert torch.isfinite(torch.tensor(sparse.metrics["kl_mean"]))


def test_lm_parts_give_the_models_own_logits(tiny):
    """The body + per-chunk head path reproduces the full forward's logits."""
    from sketchwalk.engine.run.runner import LMParts, tokenize

    ids = tokenize(tiny, PROMPT)
    with torch.no_grad():
        full = tiny.model(ids).logits[0].float()
        parts = LMParts.of(tiny.model)
        assert parts.head is not None and parts.body is not tiny.model
        hidden = parts.forward_hidden(ids)
        assert hidden.shape == (ids.shape[1], tiny.model.config.hidden_size)
        torch.testing.assert_close(parts.logits(hidden[5:17]), full[5:17], rtol=1e-4, atol=1e-4)


def test_chunked_prompt_comparison_equals_the_whole_one():
    from sketchwalk.engine.run.metrics import compare_prompt, compare_prompt_chunked

    g = torch.Generator().manual_seed(0)
    head = torch.randn(8, 50, generator=g)
    dh, sh = torch.randn(23, 8, generator=g), torch.randn(23, 8, generator=g)
    ids = torch.randint(0, 50, (23,), generator=g)
    whole = compare_prompt(dh @ head, sh @ head, ids)
    for chunk in (1, 5, 22, 64, None):
        part = compare_prompt_chunked(lambda h: h @ head, dh, sh, ids, chunk)
        assert part.kl.shape == (22,)
        torch.testing.assert_close(part.kl, whole.kl)
        torch.testing.assert_close(part.logprob_sparse, whole.logprob_sparse)
        assert torch.equal(part.agree, whole.agree)
    assert compare_prompt_chunked(lambda h: h @ head, dh[:1], sh[:1], ids[:1]).kl.numel() == 0


def test_a_run_reports_its_peak_memory(tiny):
    cfg = SketchWalkConfig(block_size=16, density=0.3)
    res = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=2, record=False))
    assert 50 < res.timings["peak_rss_mb"] < 64_000


def test_per_group_selection_records_each_group(tiny):
    """Per-group runs keep one record per KV-head group; their union is the layer's record."""
    import numpy as np

    from sketchwalk.engine.run.records import split_phase

    cfg = SketchWalkConfig(block_size=16, density=0.3, dense_layers=(0,), per_group=True)
    res = run(tiny, PROMPT, cfg, RunOptions(max_new_tokens=2))
    main = {(r.phase, r.step, r.layer): r for r in res.layers if split_phase(r.phase)[1] is None}
    groups = [r for r in res.layers if split_phase(r.phase)[1] is not None]
    assert {split_phase(r.phase)[1] for r in groups} == {0, 1}  # the tiny model: 2 KV heads
    for layer in range(1, 4):
        g0, g1 = (
            next(r for r in groups if r.phase == f"prefill:g{g}" and r.layer == layer)
            for g in (0, 1)
        )
        whole = main[("prefill", 0, layer)]
        assert np.array_equal(g0.selected | g1.selected, whole.selected)
        np.testing.assert_allclose((g0.exact + g1.exact) / 2, whole.exact, rtol=1e-5, atol=1e-7)
        assert g0.mass_recall is not None and 0 <= g0.density_achieved <= 1
    one = SketchWalkConfig(block_size=16, per_group=False)
    plain = run(tiny, PROMPT, one, RunOptions(max_new_tokens=1))
    assert all(split_phase(r.phase)[1] is None for r in plain.layers)


def test_a_run_records_the_layer_profile_it_selected_with(tiny, tmp_path, monkeypatch):
    from sketchwalk.engine.method.layer_profile import LayerProfile, fingerprint, save

    monkeypatch.setenv("SKETCHWALK_PROFILES", str(tmp_path))
    cfg = SketchWalkConfig(block_size=16, density=0.3, dense_layers=(0,))
    opts = RunOptions(max_new_tokens=2, record=True)
    assert run(tiny, PROMPT, cfg, opts).metrics["layer_densities"] is None  # no profile yet
    heads = tiny.model.config.num_key_value_heads
    shares = {k: tuple((0.2 + 0.1 * k,) for _ in range(heads)) for k in (1, 2, 3)}
    save(LayerProfile(fingerprint(tiny.model.config), (0.3,), shares, "t"))
    res = run(tiny, PROMPT, cfg, opts)
    want = {str(k): [pytest.approx(0.2 + 0.1 * k)] * heads for k in (1, 2, 3)}
    assert res.metrics["layer_densities"] == want
    targets = {r.layer: r.density_target for r in res.layers if r.phase == "prefill"}
    assert targets[2] == pytest.approx(0.4) and targets[0] is None
    uniform = run(tiny, PROMPT, cfg.with_(layer_profile="uniform"), opts)
    assert uniform.metrics["layer_densities"] is None
