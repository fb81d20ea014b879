import torch

from flux_cp.config import ModelConfig
from flux_cp.model import FluxDiT, image_ids, text_ids
from flux_cp.parallel import shard, shard_joint, unshard_joint


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
