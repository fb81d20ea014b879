import pytest
import torch

from flux_cp.config import DataConfig, ModelConfig
from flux_cp.data import make_loader
from flux_cp.model import FluxDiT, image_ids, text_ids
from flux_cp.parallel.cp import sdpa, shard, shard_joint, unshard_joint
from flux_cp.parallel.registry import make_strategy


def test_shard_then_gather_is_identity():
    text, image = torch.randn(2, 48, 5), torch.randn(2, 96, 5)
    for world in (1, 2, 3, 4):
        local = [shard_joint(text, image, 1, r, world) for r in range(world)]
        assert all(x.shape[1] == (48 + 96) // world for x in local)
        full = unshard_joint(local, text_len=48, dim=1)
        assert torch.equal(full, torch.cat([text, image], dim=1))


def test_local_rope_is_the_full_ropes_rows():
    model = FluxDiT(ModelConfig(num_heads=2, head_dim=16, double_blocks=0, single_blocks=0, rope_axes=[4, 6, 6]))
    txt, img = text_ids(48), image_ids(12, 8)
    cos, sin = model.rope(txt, img)  # (144, 16)
    for world in (2, 3, 4):
        parts = [model.rope(shard(txt, 0, r, world), shard(img, 0, r, world)) for r in range(world)]
        assert torch.equal(unshard_joint([p[0] for p in parts], 48, 0), cos)
        assert torch.equal(unshard_joint([p[1] for p in parts], 48, 0), sin)


def test_image_ids_are_row_major_positions():
    ids = image_ids(3, 4)
    assert ids.shape == (12, 3)
    assert ids[5].tolist() == [0.0, 1.0, 1.0]  # row 1, col 1
    assert torch.equal(text_ids(4), torch.zeros(4, 3))


def test_sdpa_backend_pins():
    """Only strategies with S_q != S_kv (allgather-kv) or torch's ring pin flash on CUDA."""
    cuda = torch.device("cuda")  # a device object only: nothing runs
    assert make_strategy("allgather-kv", 0, 1, cuda).sdpa_backend == "flash"
    assert make_strategy("ulysses", 0, 1, cuda).sdpa_backend == "auto"
    assert make_strategy("allgather-kv", 0, 1, cuda, sdpa_backend="cudnn").sdpa_backend == "cudnn"
    assert make_strategy("allgather-kv", 0, 1, torch.device("cpu")).sdpa_backend == "auto"


def test_sdpa_hands_its_backward_the_gradient_in_the_outputs_strides():
    """Where cuDNN may run it, SDPA's backward gets dO in the output's strides (cuDNN's cached backward graph bakes in
    dO's strides but is keyed without them), with the same values; elsewhere dO passes untouched (no copy)."""
    q, k, v = (torch.randn(2, 6, 4, 3, dtype=torch.float64).transpose(1, 2).requires_grad_() for _ in range(3))
    mlp = torch.randn(2, 6, 8, dtype=torch.float64)
    grads, strides = {}, {}
    for remedy in (False, True):
        out = sdpa(q, k, v, cudnn_possible=remedy)  # (B, H, S, D), BSHD in memory: strides (72, 3, 12, 1)
        node = out.grad_fn.next_functions[0][0] if remedy else out.grad_fn  # SDPA's own backward
        node.register_prehook(lambda g_out, r=remedy: strides.__setitem__(r, g_out[0].stride()))
        q.grad = None
        torch.cat([out.transpose(1, 2).flatten(2), mlp], dim=2).pow(2).sum().backward()  # as Flux's single block
        grads[remedy] = q.grad.clone()
    assert strides == {False: (120, 3, 20, 1), True: (72, 3, 12, 1)}  # a slice of [attention, MLP] / the output's
    assert torch.equal(grads[False], grads[True])


def test_sdpa_with_the_gradient_layout_compiles_whole_and_exact():
    """The gradient-layout identity traces into one graph (no graph break: the step graph and per-block compile keep
    it), and its compiled gradients are eager's, in fp64."""
    q, k, v = (torch.randn(2, 6, 4, 3, dtype=torch.float64).transpose(1, 2).requires_grad_() for _ in range(3))
    mlp = torch.randn(2, 6, 8, dtype=torch.float64)

    def loss(q, k, v):
        out = sdpa(q, k, v, cudnn_possible=True)
        return torch.cat([out.transpose(1, 2).flatten(2), mlp], dim=2).pow(2).sum()

    want = torch.autograd.grad(loss(q, k, v), (q, k, v))
    torch._dynamo.reset()
    got = torch.autograd.grad(torch.compile(loss, backend="aot_eager", fullgraph=True)(q, k, v), (q, k, v))
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_loader_workers_yield_the_same_batches_in_order():
    """Worker processes (the GPU default) make the same batches as the main process, in step order (dp rank 1
    of 2 here, so the workers also take the right samples)."""
    data, model = DataConfig(image_height=4, image_width=4, text_tokens=4, batch_size=1), ModelConfig(
        num_heads=2, head_dim=8, text_dim=16, pooled_dim=8, rope_axes=[2, 2, 4], in_channels=4)
    got = list(make_loader(data, model, 7, dp_rank=1, dp=2, workers=2, pin=False))
    want = list(make_loader(data, model, 7, dp_rank=1, dp=2, workers=0, pin=False))
    assert len(got) == len(want) == 7
    for a, b in zip(got, want):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(got[0]["x_t"], got[1]["x_t"])


def test_batches_come_in_the_runs_dtype():
    """Batches leave the loader in the run's dtype (Lightning's precision plugin would otherwise cast them on the
    host between steps), with the fp32 batch's values: the same data at every precision."""
    data, model = DataConfig(image_height=4, image_width=4, text_tokens=4), ModelConfig(
        num_heads=2, head_dim=8, text_dim=16, pooled_dim=8, rope_axes=[2, 2, 4], in_channels=4)
    (bf16,) = make_loader(data, model, 1, dp_rank=0, dp=1, workers=0, pin=False, dtype=torch.bfloat16)
    (fp32,) = make_loader(data, model, 1, dp_rank=0, dp=1, workers=0, pin=False)
    for k, v in fp32.items():
        assert v.dtype == torch.float32 and bf16[k].dtype == torch.bfloat16
        assert torch.equal(bf16[k], v.to(torch.bfloat16))


def test_rope_table_is_diffusers_in_fp32_and_exact_in_fp64():
    """FluxDiT.rope in fp32 is diffusers' FluxPosEmbed table bit for bit (computed in fp64, rounded); in fp64 it is
    that fp64 table, not the rounded one."""
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed

    model = FluxDiT(ModelConfig(num_heads=2, head_dim=16, double_blocks=0, single_blocks=0, rope_axes=[4, 6, 6]))
    txt, img = text_ids(48), image_ids(12, 8)
    ref = FluxPosEmbed(theta=10000, axes_dim=[4, 6, 6])(torch.cat([txt, img]))
    got32, got64 = model.rope(txt, img), model.rope(txt, img, torch.float64)
    for a, b, c in zip(got32, ref, got64):
        assert a.dtype == torch.float32 and c.dtype == torch.float64
        assert torch.equal(a, b) and torch.equal(c.float(), b)
        assert (c - b.double()).abs().max() > 1e-9  # fp32 rounding, gone in fp64


def test_apply_rope_is_diffusers_below_fp64_and_fp64_in_fp64():
    from diffusers.models.embeddings import apply_rotary_emb

    from flux_cp.model import apply_rope

    torch.manual_seed(0)
    model = FluxDiT(ModelConfig(num_heads=2, head_dim=16, double_blocks=0, single_blocks=0, rope_axes=[4, 6, 6]))
    txt, img = text_ids(8), image_ids(4, 4)
    x = torch.randn(2, 24, 3, 16, dtype=torch.float64)  # (B, S, H, D)
    rope32, rope64 = model.rope(txt, img), model.rope(txt, img, torch.float64)
    for dtype in (torch.bfloat16, torch.float32):
        xd = x.to(dtype)
        assert torch.equal(apply_rope(xd, rope32), apply_rotary_emb(xd, rope32, sequence_dim=1))
    # fp64: the rotation of each (real, imag) pair by its angle, as complex numbers
    angle = torch.atan2(rope64[1], rope64[0])[None, :, None, ::2]
    want = torch.view_as_real(torch.view_as_complex(x.reshape(2, 24, 3, 8, 2).contiguous()) * torch.polar(
        torch.ones_like(angle), angle)).flatten(3)
    got = apply_rope(x, rope64)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-14, atol=1e-14)
    assert (apply_rotary_emb(x, rope32, sequence_dim=1) - want).abs().max() > 1e-9  # diffusers' fp32 rotation


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: shard(torch.zeros(1, 5, 2), 1, 0, 4), r"shard: 5 rows \(dim 1 of \(1, 5, 2\)\) do not split evenly"),
        (lambda: shard(torch.zeros(6, 2), 0, 3, 3), r"shard: rank 3 is not in 0..2 \(world 3\)"),
        (lambda: shard_joint(torch.zeros(1, 47, 2), torch.zeros(1, 96, 2), 1, 0, 2),
         r"shard: 47 text tokens \(dim 1 of \(1, 47, 2\)\) do not split evenly over 2 ranks"),
        (lambda: shard_joint(torch.zeros(1, 48, 2), torch.zeros(1, 95, 2), 1, 1, 2), "95 image tokens"),
        (lambda: make_strategy("allgather-kv", 2, 2, torch.device("cpu")), r"allgather-kv: CP rank 2 of world 2"),
        (lambda: make_strategy("ulysses", 0, 2, torch.device("cpu")).attention(*[torch.zeros(1, 3, 4, 8)] * 3),
         "ulysses: 3 heads are not divisible by the CP world 2"),
    ],
)
def test_uneven_sizes_raise_one_line(call, message):
    """The Python API checks sizes itself (not only the CLI): one line naming them, before any collective."""
    with pytest.raises(ValueError, match=message) as e:
        call()
    assert "\n" not in str(e.value)
