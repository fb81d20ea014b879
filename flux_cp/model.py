"""A Flux-style DiT: diffusers' double- and single-stream blocks between Flux's own embedders.

It mirrors diffusers' FluxTransformer2DModel (no guidance embedding), minus everything that is
not the training step: a reader can hold it in one sitting. Context parallelism is applied from
outside (flux_cp.parallel.cp installs an attention processor); the model only sees the tokens it is
given, so a CP rank passes its local image and text tokens with their own RoPE angles.

Shapes: B batch, Si image tokens, St text tokens, S = St + Si, C latent channels, D hidden.
"""

import torch
from diffusers.models.embeddings import CombinedTimestepTextProjEmbeddings
from diffusers.models.normalization import AdaLayerNormContinuous
from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock
from torch import nn

from flux_cp.config import ModelConfig


class FluxDiT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden
        self.time_text_embed = CombinedTimestepTextProjEmbeddings(embedding_dim=d, pooled_projection_dim=cfg.pooled_dim)
        self.x_embedder = nn.Linear(cfg.in_channels, d)
        self.context_embedder = nn.Linear(cfg.text_dim, d)
        self.double_blocks = nn.ModuleList(
            FluxTransformerBlock(dim=d, num_attention_heads=cfg.num_heads, attention_head_dim=cfg.head_dim)
            for _ in range(cfg.double_blocks)
        )
        self.single_blocks = nn.ModuleList(
            FluxSingleTransformerBlock(
                dim=d, num_attention_heads=cfg.num_heads, attention_head_dim=cfg.head_dim, mlp_ratio=cfg.mlp_ratio
            )
            for _ in range(cfg.single_blocks)
        )
        self.norm_out = AdaLayerNormContinuous(d, d, elementwise_affine=False, eps=1e-6)
        self.proj_out = nn.Linear(d, cfg.in_channels)
        if cfg.fuse_qkv:
            for attn in self.attentions():
                fuse_qkv(attn)

    def attentions(self):
        """Every FluxAttention, in forward order: where a CP strategy plugs in."""
        return [blk.attn for blk in (*self.double_blocks, *self.single_blocks)]

    def conditioning_linears(self):
        """The AdaLN modulation linears: (B, D) conditioning vector -> per-block shifts, scales and gates."""
        blocks = [(b.norm1, b.norm1_context) for b in self.double_blocks] + [(b.norm,) for b in self.single_blocks]
        return [n.linear for norms in blocks for n in norms] + [self.norm_out.linear]

    def rope(self, txt_ids: torch.Tensor, img_ids: torch.Tensor, dtype=torch.float32) -> tuple[torch.Tensor, ...]:
        """(cos, sin), each (St + Si, head_dim): text first, as Flux concatenates [text, image]. dtype: fp32 (the
        table of diffusers' FluxPosEmbed, also under bf16) or fp64 (fp64 runs)."""
        cos, sin = rope_table(torch.cat([txt_ids, img_ids], dim=0), self.cfg.rope_axes)
        return cos.to(dtype), sin.to(dtype)

    def forward(self, x, text, pooled, t, rope):
        # x (B, Si, C) noisy latents; text (B, St, Dt); pooled (B, Dp); t (B,) in [0, 1]
        h = self.x_embedder(x)  # (B, Si, D)
        c = self.context_embedder(text)  # (B, St, D)
        temb = self.time_text_embed(t.to(h.dtype) * 1000, pooled)  # (B, D), Flux scales t to [0, 1000]
        for blk in self.double_blocks:
            c, h = blk(hidden_states=h, encoder_hidden_states=c, temb=temb, image_rotary_emb=rope)
        for blk in self.single_blocks:
            c, h = blk(hidden_states=h, encoder_hidden_states=c, temb=temb, image_rotary_emb=rope)
        return self.proj_out(self.norm_out(h, temb))  # (B, Si, C): predicted velocity


def rope_table(ids: torch.Tensor, axes_dim, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of (N, sum(axes_dim)) position ids (N, len(axes_dim)), in fp64: diffusers' FluxPosEmbed computes
    the same in fp64 and returns it rounded to fp32."""
    cos, sin = [], []
    for i, d in enumerate(axes_dim):
        freqs = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=ids.device) / d))  # (d/2,)
        angles = torch.outer(ids[:, i].double(), freqs)  # (N, d/2)
        cos.append(angles.cos().repeat_interleave(2, dim=1))  # each angle for a (real, imag) pair
        sin.append(angles.sin().repeat_interleave(2, dim=1))
    return torch.cat(cos, dim=-1), torch.cat(sin, dim=-1)


def apply_rope(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """diffusers' apply_rotary_emb (sequence_dim=1, Flux's interleaved pairs) for x (B, S, H, D), rotating in fp32 at
    least (bf16, fp32: the same values as diffusers') and in fp64 for fp64 x, where diffusers would round to fp32."""
    cos, sin = (t[None, :, None, :] for t in rope)  # (1, S, 1, D)
    real, imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)  # (B, S, H, D/2)
    rotated = torch.stack([-imag, real], dim=-1).flatten(3)
    dtype = torch.promote_types(x.dtype, torch.float32)
    return (x.to(dtype) * cos + rotated.to(dtype) * sin).to(x.dtype)


@torch.no_grad()
def fuse_qkv(attn) -> None:
    """diffusers' fuse_projections (one to_qkv GEMM per stream), minus the unfused originals.

    diffusers keeps to_q/to_k/to_v after fusing; left in place they would be parameters without
    gradients (DDP errors on them, AdamW would step them), so they go.
    """
    attn.fuse_projections()
    for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
        if hasattr(attn, name):
            delattr(attn, name)


def image_ids(height: int, width: int) -> torch.Tensor:
    """(height * width, 3) position ids (0, row, col), row-major like Flux's packed latents."""
    ids = torch.zeros(height, width, 3)
    ids[..., 1] = torch.arange(height)[:, None]
    ids[..., 2] = torch.arange(width)[None, :]
    return ids.reshape(height * width, 3)


def text_ids(n: int) -> torch.Tensor:
    """(n, 3) text position ids: all zero in Flux (text tokens carry no 2-D position)."""
    return torch.zeros(n, 3)


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
