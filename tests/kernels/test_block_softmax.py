"""The block softmax in C (kernels/block_softmax.c) against its torch reference."""

import pytest
import torch

from sketchwalk.kernels.block_softmax import (
    PackedKeys,
    _unpack_vnni,
    block_softmax_sums,
    block_softmax_sums_reference,
    pack_keys,
    pack_keys_vnni,
    scored_block_mass,
)
from sketchwalk.kernels.native import amx, library


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block", [1, 3, 16, 32, 64])
@pytest.mark.parametrize("seed", range(6))
def test_c_equals_the_torch_reference_on_random_rows(dtype, block, seed):
    assert library() is not None
    gen = torch.Generator().manual_seed(seed * 100 + block)
    lead = [tuple(int(x) for x in torch.randint(1, 5, (k,), generator=gen)) for k in (1, 2, 3)]
    shape = (*lead[seed % 3], int(torch.randint(1, 300, (1,), generator=gen)))
    width = shape[-1]
    scale = float(torch.empty(1).uniform_(0.1, 30, generator=gen))
    scores = (torch.randn(shape, generator=gen) * scale).to(dtype)
    hi = torch.randint(0, width + 3, shape[:-1], generator=gen)  # past the row, empty rows too
    lo = torch.randint(-2, width, shape[:-1], generator=gen)  # before it, past hi too
    got = block_softmax_sums(scores, lo, hi, block)
    want = block_softmax_sums_reference(scores, lo, hi, block)
    assert got.shape == want.shape == (*shape[:-1], -(-width // block))
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)
    seen = hi.clamp(max=width) > lo.clamp(min=0)
    sums = got.sum(-1)
    assert torch.allclose(sums[seen], torch.ones(1), atol=1e-5)
    assert torch.equal(sums[~seen], torch.zeros_like(sums[~seen]))


def test_broadcast_bounds_and_extreme_scores():
    """lo and hi broadcast over the rows (the estimator passes one start per sequence and one
    end per query); scores far below a row's max underflow to 0 instead of going wrong."""
    scores = torch.tensor([[0.0, -1e4, 50.0, 49.0, -200.0, 3.0]]).repeat(2, 3, 1)
    lo = torch.tensor([0, 1]).view(2, 1)
    hi = torch.tensor([6, 2, 4])
    got = block_softmax_sums(scores, lo, hi, 2)
    assert torch.allclose(got, block_softmax_sums_reference(scores, lo, hi, 2), atol=1e-6)
    assert got[1, 1].tolist() == [1.0, 0.0, 0.0]  # sees column 1 only
    assert block_softmax_sums(scores, 0, 6, 4).shape == (2, 3, 2)


@pytest.mark.parametrize("seed", range(24))
def test_scored_block_mass_equals_the_product_and_the_reference(seed):
    """Scores and block mass in one C call against the torch product and reference softmax:
    widths past several 512-key chunks (the running max rescaled when a later chunk raises it),
    partial panels and tiles, empty rows, head dims that are not multiples of 8."""
    gen = torch.Generator().manual_seed(seed)
    lead = [(), (3,), (2, 2)][seed % 3]
    rows = int(torch.randint(1, 20, (1,), generator=gen))
    r = [64, 5, 16, 128][seed % 4]
    length = int(torch.randint(1, 1700, (1,), generator=gen))
    width = int(torch.randint(1, length + 1, (1,), generator=gen))
    b = [1, 3, 8, 16, 32, 64][seed % 6]  # 8, 16, ...: 8 columns at a time; 1, 3: one at a time
    q = torch.randn(*lead, rows, r, generator=gen)
    k = torch.randn(*lead, length, r, generator=gen)
    k = k * torch.linspace(0.2, 3.0, length)[:, None]  # later keys score larger: the max moves
    lo = torch.randint(-3, width, (*lead, rows), generator=gen)
    hi = torch.randint(0, width + 4, (*lead, rows), generator=gen)
    got = scored_block_mass(q, pack_keys(k), lo, hi, b, width)
    scores = q @ k[..., :width, :].transpose(-1, -2)
    want = block_softmax_sums_reference(scores, lo, hi, b)
    assert got.shape == want.shape == (*lead, rows, -(-width // b))
    assert torch.allclose(got, want, atol=3e-6, rtol=1e-4)


@pytest.mark.parametrize("block", [3, 8, 32])
def test_scored_block_mass_hides_columns_that_would_overflow(block):
    """Columns outside lo .. hi may score far above the visible ones (later keys, padding): they
    add nothing, even in the groups of 8 that straddle a row's edges, and nothing overflows."""
    length, r = 600, 8
    q = torch.ones(4, r)
    k = torch.randn(length, r, generator=torch.Generator().manual_seed(0)) * 0.1
    k[:5] = 2e3  # scores ~1.6e4 before lo
    k[500:] = 2e3  # and after hi
    lo = torch.tensor([5, 7, 9, 3])
    hi = torch.tensor([500, 499, 13, 301])
    got = scored_block_mass(q, pack_keys(k), lo, hi, block, length)
    scores = q @ k.T
    want = block_softmax_sums_reference(scores, lo, hi, block)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, want, atol=3e-6, rtol=1e-4)
    assert torch.allclose(got.sum(-1), torch.ones(4), atol=1e-5)


def test_scored_block_mass_without_c_is_the_product_and_a_wrong_packing_is_an_error(monkeypatch):
    q, k = torch.randn(2, 7, 64), torch.randn(2, 100, 64)
    fast = scored_block_mass(q, pack_keys(k), 0, 90, 16, 90)
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    slow = scored_block_mass(q, pack_keys(k), 0, 90, 16, 90)
    assert torch.allclose(fast, slow, atol=2e-6)
    monkeypatch.setenv("SKETCHWALK_NATIVE", "1")
    assert pack_keys(k).shape == (2, 7, 64, 16)  # 100 keys in 7 panels of 16
    with pytest.raises(ValueError, match="do not fit"):
        scored_block_mass(q, pack_keys(k[:, :40]), 0, 90, 16, 90)  # 48 packed keys < width


@pytest.mark.parametrize("seed", range(16))
def test_bfloat16_scored_block_mass_equals_the_reference_on_rounded_inputs(seed):
    """bfloat16 queries against keys packed for AMX tiles (pack_keys_vnni): on AMX the tile
    kernel, elsewhere the torch product; either way the reference on the rounded inputs with the
    products summed in float32: rows past one 16-row tile, partial panels, empty rows, both tile
    widths."""
    gen = torch.Generator().manual_seed(seed)
    lead = [(), (3,), (2, 2)][seed % 3]
    rows = int(torch.randint(1, 40, (1,), generator=gen))
    r = [64, 128][seed % 2]
    length = int(torch.randint(1, 1700, (1,), generator=gen))
    width = int(torch.randint(1, length + 1, (1,), generator=gen))
    b = [8, 16, 32, 3][seed % 4]
    q = torch.randn(*lead, rows, r, generator=gen).bfloat16()
    k = torch.randn(*lead, length, r, generator=gen) * torch.linspace(0.2, 3.0, length)[:, None]
    lo = torch.randint(-3, width, (*lead, rows), generator=gen)
    hi = torch.randint(0, width + 4, (*lead, rows), generator=gen)
    got = scored_block_mass(q, pack_keys_vnni(k), lo, hi, b, width)
    scores = q.float() @ k[..., :width, :].bfloat16().float().transpose(-1, -2)
    want = block_softmax_sums_reference(scores, lo, hi, b)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-3)


@pytest.mark.parametrize("block", [16, 48])
def test_bfloat16_scored_block_mass_across_long_chunks(block):
    """Past the AMX call's 8192-key chunk: keys that score ever larger move each row's max in
    the second chunk (the first chunk's sums rescaled), rows ending on both sides of it."""
    gen = torch.Generator().manual_seed(block)
    rows, r, width = 37, 64, 8192 + 900
    q = torch.randn(rows, r, generator=gen).bfloat16()
    k = torch.randn(width, r, generator=gen) * torch.linspace(0.2, 2.0, width)[:, None]
    lo = torch.randint(-3, 8300, (rows,), generator=gen)
    hi = torch.randint(8000, width + 4, (rows,), generator=gen)
    got = scored_block_mass(q, pack_keys_vnni(k), lo, hi, block, width)
    scores = q.float() @ k.bfloat16().float().T
    want = block_softmax_sums_reference(scores, lo, hi, block)
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-3)


def test_amx_is_what_the_cpu_and_the_compiler_have(monkeypatch):
    """amx() says whether the bfloat16 call runs on tiles: only where the CPU lists AMX (Linux's
    cpuinfo flags), never without the C kernels; where it runs, the torch product is not used."""
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = next((ln.split(":")[1].split() for ln in f if ln.startswith("flags")), [])
    if amx():
        assert {"amx_tile", "amx_bf16"} <= set(flags)
        q, k = torch.randn(5, 64).bfloat16(), torch.randn(300, 64)

        def no_product(*args, **kwargs):
            raise AssertionError("the torch product ran")

        monkeypatch.setattr(torch.Tensor, "__matmul__", no_product)
        got = scored_block_mass(q, pack_keys_vnni(k), 0, 300, 16, 300)
        assert torch.allclose(got.sum(-1), torch.ones(5), atol=1e-5)
        monkeypatch.undo()
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    assert not amx()


@pytest.mark.parametrize("r", [64, 128])
def test_packed_keys_follow_a_growing_cache(r):
    """PackedKeys keeps pack_keys_vnni's layout of a cache grown by 1, 15, 16, 17 and a few
    hundred keys (panels filled across calls, the buffer grown past its room): its first panels
    always unpack to the cache's keys in bfloat16, the rest stays zero, and the fused call on it
    equals the reference. A shorter cache or another shape starts afresh."""
    gen = torch.Generator().manual_seed(r)
    cache = torch.randn(2, 3, 900, r, generator=gen)
    packed = PackedKeys()
    length = 0
    for grow in (5, 1, 15, 16, 17, 300, 1, 200):
        length += grow
        keys = cache[:, :, :length]
        buf = packed.update(keys)
        unpacked = _unpack_vnni(buf)
        assert torch.equal(unpacked[..., :length, :], keys.bfloat16())
        assert not unpacked[..., length:, :].any()
    q = torch.randn(2, 3, 7, r, generator=gen).bfloat16()
    got = scored_block_mass(q, buf, 0, length, 16, length)
    want = block_softmax_sums_reference(q.float() @ keys.bfloat16().float().transpose(-1, -2),
                                        0, length, 16)  # fmt: skip
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-3)
    other = torch.randn(2, 3, 40, r, generator=gen)  # a new, shorter cache: packed afresh
    assert torch.equal(_unpack_vnni(packed.update(other))[..., :40, :], other.bfloat16())
    one = torch.randn(1, 3, 50, r, generator=gen)  # another batch
    assert torch.equal(_unpack_vnni(packed.update(one))[..., :50, :], one.bfloat16())


@pytest.mark.parametrize("seed", range(6))
def test_c_packing_equals_torchs_bit_for_bit(seed, monkeypatch):
    """pack_keys_vnni in C (float32 keys [B, Hkv, L, r], any strides but the last) gives torch's
    bits: round-to-nearest-even ties, NaN, infinities, -0.0 and subnormals included, keys past L
    zero; PackedKeys grown in C from a panel's middle equals a fresh packing."""
    gen = torch.Generator().manual_seed(seed)
    length, r = int(torch.randint(1, 300, (1,), generator=gen)), [64, 128, 2, 6][seed % 4]
    base = torch.randn(2, 5, length + 9, r, generator=gen)
    bits = base.view(torch.int32)
    tie = torch.rand(base.shape, generator=gen) < 0.2  # exactly halfway between two bfloat16
    bits[tie] = (bits[tie] & ~0xFFFF) | 0x8000
    flat = base.view(-1)
    flat[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    flat[4] = 1e-41  # subnormal
    k = base[:, 1:4, 3 : 3 + length]  # a strided view, as a cache hands its keys over
    fast = pack_keys_vnni(k)
    monkeypatch.setenv("SKETCHWALK_NATIVE", "0")
    slow = pack_keys_vnni(k)
    assert torch.equal(fast.view(torch.int16), slow.view(torch.int16))
    grown = PackedKeys()
    grown.update(k[:, :, : max(length - 21, 0)])
    monkeypatch.setenv("SKETCHWALK_NATIVE", "1")
    got = grown.update(k)
    assert torch.equal(got[:, :, : slow.shape[2]].view(torch.int16), slow.view(torch.int16))
    assert library() is not None
