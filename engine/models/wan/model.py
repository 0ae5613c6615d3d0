"""The Wan2.1 causal family (Self-Forcing, CausVid, LongLive base) on diffusers' modules.

:class:`WanChunkModel` runs one chunk of latent frames per batch row through a
``WanTransformer3DModel`` whose self-attention goes through the engine's paged KV cache
(``engine.models.wan.attention``): a forward attends the keys/values already in the session's
pages (earlier chunks, written by cache fills) plus its own, i.e. block-causal attention by
chunk. It reuses the model's modules in the order of diffusers' ``forward`` (same numbered
stages) with three differences: RoPE at absolute frame positions per batch row, one timestep
per row, and the text projection (``condition_embedder.text_embedder``) done once per prompt
by :meth:`WanChunkModel.project_text` instead of at every forward.

Loading (local directories only) is in ``engine.models.wan.loading``.
"""

from __future__ import annotations

import torch
from diffusers import WanTransformer3DModel

from worldstream.engine.models.wan.attention import chunk_rotary_emb, install_paged_attention

#: Wan is trained on flow-matching time t = 1000 * sigma
NUM_TRAIN_TIMESTEPS = 1000


class WanChunkModel:
    """A ``WanTransformer3DModel`` that denoises chunks through a paged KV cache.

    The model's ``attn1`` processors are replaced at construction, so a plain
    ``model.forward`` afterwards raises; use :meth:`forward_chunk`.
    """

    def __init__(self, transformer: WanTransformer3DModel):
        cfg = transformer.config
        if cfg.image_dim is not None or cfg.added_kv_proj_dim is not None:
            raise ValueError("image-conditioned Wan transformers are not supported "
                             "(text-to-video only)")
        self.transformer = transformer
        self.binding = install_paged_attention(transformer)
        self.patch_size = tuple(cfg.patch_size)
        self.num_layers = cfg.num_layers
        self.num_heads = cfg.num_attention_heads
        self.head_dim = cfg.attention_head_dim

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        """Tokens of one latent frame after patchifying (the page size)."""
        _, ph, pw = self.patch_size
        if latent_height % ph or latent_width % pw:
            raise ValueError(f"latent size {latent_height}x{latent_width} is not a multiple of "
                             f"the patch {ph}x{pw}")
        return (latent_height // ph) * (latent_width // pw)

    @torch.no_grad()
    def project_text(self, text_states: torch.Tensor) -> torch.Tensor:
        """UMT5 states ``(B, L, text_dim)`` -> cross-attention context ``(B, L, inner_dim)``
        (cache it per prompt)."""
        embedder = self.transformer.condition_embedder.text_embedder
        dtype = next(embedder.parameters()).dtype
        return embedder(text_states.to(dtype))

    @torch.no_grad()
    def forward_chunk(self, latents: torch.Tensor, timestep: torch.Tensor,
                      text: torch.Tensor, frame_start: torch.Tensor, context) -> torch.Tensor:
        """Predict the flow (``noise - x0``) of one chunk per batch row.

        Args:
            latents: ``(B, C, F, h, w)`` noisy latents at the rows' noise levels.
            timestep: ``(B,)`` float, ``1000 * sigma`` of each row.
            text: ``(B, L, inner_dim)`` projected prompt (:meth:`project_text`).
            frame_start: ``(B,)`` int, absolute latent-frame index of each row's first frame.
            context: the attention context (``engine.backends.paged_context
                .PagedAttentionContext``): it writes this chunk's keys/values to its pages and
                attends the rows' pages.
        Returns:
            ``(B, C, F, h, w)`` flow prediction in the transformer's dtype.
        """
        model = self.transformer
        b, _, f, h, w = latents.shape
        p_t, p_h, p_w = self.patch_size
        pf, ph, pw = f // p_t, h // p_h, w // p_w
        dtype = next(model.proj_out.parameters()).dtype
        # 1. patch & position embedding
        rotary = chunk_rotary_emb(model.rope, frame_start, pf, ph, pw)
        rotary = tuple(r.to(latents.device) for r in rotary)
        x = model.patch_embedding(latents.to(dtype)).flatten(2).transpose(1, 2).contiguous()
        # 2. condition embeddings (time only; the text is projected once per prompt)
        embed = model.condition_embedder
        t = embed.timesteps_proj(timestep.float())
        t = t.to(next(embed.time_embedder.parameters()).dtype)
        temb = embed.time_embedder(t).type_as(text)
        modulation = embed.time_proj(embed.act_fn(temb)).unflatten(1, (6, -1))
        # 3. transformer blocks, self-attention through the paged cache
        self.binding.context = context
        try:
            for block in model.blocks:
                x = block(x, text, modulation, rotary)
        finally:
            self.binding.context = None
        # 4. output norm, projection & unpatchify
        shift, scale = (model.scale_shift_table.to(temb.device)
                        + temb.unsqueeze(1)).chunk(2, dim=1)
        x = (model.norm_out(x.float()) * (1 + scale) + shift).type_as(x)
        x = model.proj_out(x)
        x = x.reshape(b, pf, ph, pw, p_t, p_h, p_w, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)
