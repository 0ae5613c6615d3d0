"""The built-in autoencoder: diffusers ``AutoencoderTiny`` configured for 128×128 RGB frames and
``(4, 32, 32)`` latents (4× spatial downsampling in three stages, 4 latent channels).

NOTE: three stages rather than four: a deeper downsampling reconstructs too blurry, which caps
every generated frame's sharpness, and costs more per frame (see the model card).

``AutoencoderTiny.forward`` quantises latents to uint8 and cuts the gradient, so training and the
engine call ``encoder``/``decoder`` directly: images in [-1, 1] -> latents -> images in [-1, 1].
"""

from __future__ import annotations

import torch
from diffusers import AutoencoderTiny

LATENT_CHANNELS = 4
STAGES = 3
DOWNSAMPLE = 2 ** (STAGES - 1)  # image pixels per latent pixel (the first stage keeps the size)


def build_autoencoder(
    width: int = 32, latent_channels: int = LATENT_CHANNELS, stages: int = STAGES
) -> AutoencoderTiny:
    """A fresh autoencoder with ``2 ** (stages - 1)``× downsampling; ``width`` channels in
    every stage (AutoencoderTiny requires equal entries). About 0.32 M parameters at width 32,
    3 stages."""
    return AutoencoderTiny(
        encoder_block_out_channels=(width,) * stages,
        decoder_block_out_channels=(width,) * stages,
        num_encoder_blocks=(1, 2, 2, 2)[:stages],
        num_decoder_blocks=(2, 2, 2, 1)[-stages:],
        latent_channels=latent_channels,
    )


def frames_to_tensor(frames) -> torch.Tensor:
    """``(..., H, W, 3)`` uint8 numpy/tensor -> ``(..., 3, H, W)`` float32 in [-1, 1]."""
    x = torch.as_tensor(frames)
    return x.movedim(-1, -3).float().div(127.5).sub(1.0)


def tensor_to_frames(x: torch.Tensor) -> torch.Tensor:
    """``(..., 3, H, W)`` float in [-1, 1] -> ``(..., H, W, 3)`` uint8 tensor (rounded, clamped)."""
    return x.float().add(1.0).mul(127.5).round().clamp(0, 255).to(torch.uint8).movedim(-3, -1)


def psnr_db(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR in dB between two image tensors in [-1, 1] (peak-to-peak 2)."""
    mse = torch.mean((a.float() - b.float()) ** 2).item()
    return float("inf") if mse == 0 else 10.0 * torch.log10(torch.tensor(4.0 / mse)).item()
