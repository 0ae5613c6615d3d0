"""Memory pictures encoded (and decoded) once while they stay in a small cache, by content.

NOTE: encoding is deterministic, so a cached latent is the latent; a still camera (the
avatar's) reads one picture for the whole stream, whose encode and decode would otherwise
dominate each frame.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from worldstream.engine.backends.builtin.protocol import BuiltinRunner

#: distinct memory pictures kept
CACHE_SIZE = 64


def picture_key(picture: np.ndarray) -> bytes:
    """A memory picture's content hash (the cache's key)."""
    return hashlib.blake2b(picture.tobytes(), digest_size=16).digest()


class BaseCache:
    """Latents ``(C, h, w)`` and decoded pictures ``(H, W, 3)`` uint8 of memory pictures by
    content hash, the :data:`CACHE_SIZE` most recently used kept."""

    def __init__(self) -> None:
        self._entries: OrderedDict[bytes, tuple[torch.Tensor, np.ndarray | None]] = (
            OrderedDict())

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def encode(self, backend: BuiltinRunner, pictures: list[np.ndarray], keys: list[bytes]
               ) -> torch.Tensor:
        """Model-space latents ``(N, C, h, w)`` of memory pictures ``(H, W, 3)`` uint8
        (``keys``: their hashes), each encoded by ``backend.encode_frames`` only when it is
        not cached."""
        entries = self._entries
        missing = list(dict.fromkeys(k for k in keys if k not in entries))
        if missing:
            index = {k: i for i, k in enumerate(keys)}
            fresh = backend.encode_frames(np.stack([pictures[index[k]] for k in missing])).cpu()
            for k, z in zip(missing, fresh):
                entries[k] = (z, None)
        for k in keys:
            entries.move_to_end(k)
        self._trim()
        return torch.stack([entries[k][0] for k in keys])

    def decoded(self, backend: BuiltinRunner, key: bytes, z: torch.Tensor) -> np.ndarray:
        """The decoded base ``(H, W, 3)`` uint8 of the picture ``key`` (latent ``z``), decoded
        by ``backend.decode_latents`` once while it stays cached."""
        entry = self._entries.get(key)
        if entry is not None and entry[1] is not None:
            return entry[1]
        rgb = backend.decode_latents(z[None])[0]
        self._entries[key] = (z, rgb)
        self._trim()
        return rgb

    def _trim(self) -> None:
        while len(self._entries) > CACHE_SIZE:
            self._entries.popitem(last=False)
