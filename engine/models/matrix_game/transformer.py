"""Matrix-Game 2.0's causal DiT on diffusers' Wan blocks, one chunk per batch row through the
engine's paged KV cache.

The model is a ``WanTransformer3DModel`` (Wan2.1-1.3B sizes, 36 input channels, CLIP image
tokens through its ``image_embedder`` as the only cross-attention context: its text embedder
is removed) whose first blocks carry a :class:`MatrixGameActionModule` as ``action_model``.
Self-attention goes through the paged cache exactly as the Wan causal family's
(``engine.models.wan.attention``: RoPE at absolute frame positions). Unlike Wan text-to-video,
every latent frame has its own timestep: the blocks' modulation is per frame, so the block
forward is written here in diffusers' order with the action module between cross-attention
and feed-forward.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import WanTransformer3DModel

from worldstream.engine.models.matrix_game.action_module import (
    MatrixGameActionModule,
    action_rope,
)
from worldstream.engine.models.matrix_game.config import MatrixGameConfig
from worldstream.engine.models.wan.attention import chunk_rotary_emb, install_paged_attention

#: Wan is trained on flow-matching time t = 1000 * sigma
NUM_TRAIN_TIMESTEPS = 1000


def build_transformer(config: MatrixGameConfig) -> WanTransformer3DModel:
    """The DiT of ``config`` with random weights, on the current default device (use
    ``torch.device("meta")`` for shapes only). Its state dict names are diffusers' Wan names
    plus ``blocks.N.action_model.*`` (``engine.models.matrix_game.loading`` converts the
    published ones)."""
    c = config
    model = WanTransformer3DModel(
        patch_size=c.patch_size, num_attention_heads=c.num_heads,
        attention_head_dim=c.dim // c.num_heads, in_channels=c.in_dim, out_channels=c.out_dim,
        text_dim=1, freq_dim=c.freq_dim, ffn_dim=c.ffn_dim, num_layers=c.num_layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=c.eps,
        image_dim=c.image_dim, added_kv_proj_dim=None)
    # NOTE: no text: the image tokens are the whole context (not concatenated to a prompt)
    model.condition_embedder.text_embedder = None
    for layer, index in enumerate(c.action.blocks):
        model.blocks[index].action_model = MatrixGameActionModule(c.action, layer)
    for block in model.blocks:
        if not hasattr(block, "action_model"):
            block.action_model = None
    return model


def _per_frame(x: torch.Tensor, frames: int, scale: torch.Tensor, shift: torch.Tensor
               ) -> torch.Tensor:
    """``x * (1 + scale) + shift`` of tokens ``(B, frames * S, C)`` with per-frame tables
    ``(B, frames, 1, C)``, float32."""
    return (x.float().unflatten(1, (frames, -1)) * (1 + scale) + shift).flatten(1, 2)


class MatrixGameChunkModel:
    """A :func:`build_transformer` model that denoises chunks through a paged KV cache (its
    ``attn1`` processors are replaced: use :meth:`forward_chunk`)."""

    def __init__(self, transformer: WanTransformer3DModel, config: MatrixGameConfig):
        self.transformer, self.config = transformer, config
        self.binding = install_paged_attention(transformer)
        self.num_layers, self.num_heads = config.num_layers, config.num_heads
        self.head_dim = config.dim // config.num_heads

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        """Tokens of one latent frame (the page size)."""
        _, ph, pw = self.config.patch_size
        if latent_height % ph or latent_width % pw:
            raise ValueError(f"latent size {latent_height}x{latent_width} is not a multiple of "
                             f"the patch {ph}x{pw}")
        return (latent_height // ph) * (latent_width // pw)

    @torch.no_grad()
    def project_image(self, tokens: torch.Tensor) -> torch.Tensor:
        """CLIP tokens ``(B, 257, image_dim)`` -> cross-attention context ``(B, 257, dim)``
        (``img_emb``; once per session)."""
        embedder = self.transformer.condition_embedder.image_embedder
        # its layer norms are float32 and return their input's dtype: the linears' then
        return embedder(tokens.to(self.transformer.proj_out.weight.dtype))

    @torch.no_grad()
    def forward_chunk(self, latents: torch.Tensor, cond: torch.Tensor, timestep: torch.Tensor,
                      context: torch.Tensor, frame_start: torch.Tensor,
                      mouse: torch.Tensor | None, keyboard: torch.Tensor | None,
                      attention: Any) -> torch.Tensor:
        """Predict the flow (``noise - x0``) of one chunk per batch row.

        Args:
            latents: ``(B, 16, F, h, w)`` noisy latents.
            cond: ``(B, 20, F, h, w)`` the image condition of these frames (4 mask channels:
                ones on the stream's frame 0; 16 channels: the start picture's latents).
            timestep: ``(B, F)`` float, ``1000 * sigma`` of each frame.
            context: ``(B, 257, dim)`` projected image tokens (:meth:`project_image`).
            frame_start: ``(B,)`` int, absolute latent-frame index of each row's first frame.
            mouse: ``(B, F, 24)`` mouse windows, or None (a model without mouse input).
            keyboard: ``(B, F, 12, keyboard_dim)`` keyboard windows.
            attention: the paged attention context (``attend(q, k, v, layer)``) that also
                serves the action modules (``attend_mouse``, ``attend_keyboard``).
        Returns:
            ``(B, 16, F, h, w)`` flow prediction, the transformer's dtype.
        """
        model, c = self.transformer, self.config
        b, _, f, h, w = latents.shape
        p_t, p_h, p_w = c.patch_size
        pf, ph, pw = f // p_t, h // p_h, w // p_w
        dtype = next(model.proj_out.parameters()).dtype
        # 1. patch & position embeddings (noise and condition on the channels)
        rotary = tuple(r.to(latents.device) for r in
                       chunk_rotary_emb(model.rope, frame_start, pf, ph, pw))
        x = torch.cat([latents, cond.to(latents.dtype)], 1).to(dtype)
        x = model.patch_embedding(x).flatten(2).transpose(1, 2).contiguous()
        rope = tuple(r.to(latents.device) for r in action_rope(c.action, frame_start, pf))
        # 2. time embeddings, one per frame: (B, F, C) and the blocks' (B, F, 6, C)
        embed = model.condition_embedder
        t = embed.timesteps_proj(timestep.flatten().float())
        temb = embed.time_embedder(t.to(next(embed.time_embedder.parameters()).dtype))
        # the time embedder is kept in float32, its projection is not
        modulation = embed.time_proj(embed.act_fn(temb).to(dtype)).float().view(b, pf, 6, -1)
        temb = temb.float().view(b, pf, 1, -1)
        # 3. blocks: self-attention through the paged cache, cross-attention, actions, ffn
        self.binding.context = attention
        try:
            for block in model.blocks:
                x = self._block(block, x, pf, modulation, context.to(x.dtype), rotary,
                                mouse, keyboard, rope, attention)
        finally:
            self.binding.context = None
        # 4. output norm (per-frame modulation), projection & unpatchify
        shift, scale = (model.scale_shift_table[:, None] + temb).chunk(2, dim=2)
        x = _per_frame(model.norm_out(x.float()), pf, scale, shift).type_as(x)
        x = model.proj_out(x)
        x = x.reshape(b, pf, ph, pw, p_t, p_h, p_w, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)

    @staticmethod
    def _block(block, x, frames, modulation, context, rotary, mouse, keyboard, rope,
               attention) -> torch.Tensor:
        """One Wan block with per-frame modulation ``(B, F, 6, C)`` and its action module."""
        shift, scale, gate, c_shift, c_scale, c_gate = (
            block.scale_shift_table[:, None] + modulation).chunk(6, dim=2)
        # self-attention (paged, block-causal)
        h = _per_frame(block.norm1(x.float()), frames, scale, shift).type_as(x)
        out = block.attn1(h, None, None, rotary)
        x = (x.float() + (out.float().unflatten(1, (frames, -1)) * gate).flatten(1, 2)
             ).type_as(x)
        # cross-attention to the image tokens
        x = x + block.attn2(block.norm2(x.float()).type_as(x), context, None, None)
        # the actions (the blocks the config lists)
        if block.action_model is not None:
            x = block.action_model(x, frames, mouse, keyboard, rope, attention)
        # feed-forward
        h = _per_frame(block.norm3(x.float()), frames, c_scale, c_shift).type_as(x)
        out = block.ffn(h)
        return (x.float() + (out.float().unflatten(1, (frames, -1)) * c_gate).flatten(1, 2)
                ).type_as(x)
