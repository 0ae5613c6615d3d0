"""The built-in autoencoder: diffusers ``AutoencoderTiny`` configured for 128×128 RGB frames and
``(8, 16, 16)`` latents (8× spatial downsampling in four stages, 8 latent channels).

``AutoencoderTiny.forward`` quantises latents to uint8 and cuts the gradient, so training and the
engine call ``encoder``/``decoder`` directly: images in [-1, 1] -> latents -> images in [-1, 1].
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderTiny

LATENT_CHANNELS = 8
DOWNSAMPLE = 8


def build_autoencoder(width: int = 32, latent_channels: int = LATENT_CHANNELS) -> AutoencoderTiny:
    """A fresh autoencoder; ``width`` channels in every stage (AutoencoderTiny requires equal
    entries). About 0.45 M parameters at width 32."""
    return AutoencoderTiny(
        encoder_block_out_channels=(width,) * 4,
        decoder_block_out_channels=(width,) * 4,
        num_encoder_blocks=(1, 2, 2, 2),
        num_decoder_blocks=(2, 2, 2, 1),
        latent_channels=latent_channels,
    )


def frames_to_tensor(frames) -> torch.Tensor:
    """``(..., H, W, 3)`` uint8 numpy/tensor -> ``(..., 3, H, W)`` float32 in [-1, 1]."""
    x = torch.as_tensor(frames)
    return x.movedim(-1, -3).float().div(127.5).sub(1.0)


def tensor_to_frames(x: torch.Tensor) -> torch.Tensor:
    """``(..., 3, H, W)`` float in [-1, 1] -> ``(..., H, W, 3)`` uint8 tensor (rounded, clamped)."""
    return x.float().add(1.0).mul(127.5).round().clamp(0, 255).to(torch.uint8).movedim(-3, -1)


@torch.no_grad()
def encode(ae: AutoencoderTiny, frames: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """``(N, 3, 128, 128)`` in [-1, 1] -> ``(N, 8, 16, 16)`` float32 latents."""
    return torch.cat(
        [ae.encoder(frames[i : i + batch]).float() for i in range(0, len(frames), batch)]
    )


@torch.no_grad()
def decode(ae: AutoencoderTiny, latents: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """``(N, 8, 16, 16)`` latents -> ``(N, 3, 128, 128)`` float32 in [-1, 1]."""
    return torch.cat(
        [ae.decoder(latents[i : i + batch]).float() for i in range(0, len(latents), batch)]
    )


def psnr_db(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB between two image tensors in [-1, 1] (peak-to-peak 2)."""
    mse = torch.mean((a.float() - b.float()) ** 2).item()
    return float("inf") if mse == 0 else 10.0 * torch.log10(torch.tensor(4.0 / mse)).item()
