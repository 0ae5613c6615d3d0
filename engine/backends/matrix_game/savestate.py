"""Save-point state of Matrix-Game 2.0 (``matrix-game-2:VARIANT``): the keys/values of the
state's pages in time order, in the KV pool and in the action modules' pools (the same page
ids), the start picture's conditioning (projected CLIP tokens ``text`` and the 20 condition
channels ``cond``), each retained chunk's latents, action windows and raw-action tails, the
VAE decoder's causal feature cache and the RNG state as arrays; the rest as JSON scalars.

Tensors keep their dtype bit for bit: bfloat16 (CUDA) is stored as its int16 bits (numpy has
no bfloat16), float32 as is. A full-size state is far above ``MAX_SAVEPOINT_BYTES`` (216 MB a
latent frame in bfloat16 at 352x640, up to 12 frames): it is refused before anything is
copied, with its size.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from worldstream.engine.backends.paged_savestate import restored_pages
from worldstream.engine.studio.savepoint import MAX_SAVEPOINT_BYTES, SavepointError

if TYPE_CHECKING:
    import torch


# NOTE: torch is imported in the functions: the save-point module is imported by every world's
# server, the simulators' included, which never load torch


def _to_array(t: torch.Tensor) -> np.ndarray:
    """A tensor's values on the CPU, exactly (bfloat16 as its int16 bits)."""
    import torch

    t = t.detach().cpu().contiguous()
    return t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _to_tensor(a: np.ndarray, dtype: torch.dtype, device: torch.device, name: str
               ) -> torch.Tensor:
    """The inverse of :func:`_to_array` for a tensor of ``dtype``; SavepointError naming
    ``name`` for an array of another dtype."""
    import torch

    stored = torch.int16 if dtype == torch.bfloat16 else dtype
    t = torch.from_numpy(np.array(a, copy=True))
    if t.dtype != stored:
        raise SavepointError(f"the save point's {name} is {a.dtype}; this model keeps {dtype}")
    return (t.view(torch.bfloat16) if dtype == torch.bfloat16 else t).to(device)


def _pools(gen) -> dict[str, torch.Tensor]:
    """Every pool indexed by page id (dim 1): the self-attention's and the action modules'."""
    act = gen.action_pools
    pools = {"kv.k": gen.k_pool, "kv.v": gen.v_pool, "act.key_k": act.key_k,
             "act.key_v": act.key_v}
    if act.mouse_k is not None:
        pools.update({"act.mouse_k": act.mouse_k, "act.mouse_v": act.mouse_v})
    return pools


def _check_size(gen, state, pages: int) -> None:
    """SavepointError (nothing copied) when the state's file would pass the size limit."""
    per_page = sum(p[:, 0].numel() * p.element_size() for p in _pools(gen).values())
    others = sum(r.latents.numel() * 4 for r in state.history) + state.cond.numel() * 4
    total = pages * per_page + others
    if total > MAX_SAVEPOINT_BYTES:
        raise SavepointError(f"this world's state is {total / 2**20:.0f} MB ({pages} latent "
                             f"frames of keys and values); a save point holds at most "
                             f"{MAX_SAVEPOINT_BYTES // 2**20} MB")


def export_matrix_game(gen, state) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, scalars)`` of a Matrix-Game state; SavepointError for a freed state or one
    too large for a save file."""
    import torch

    with gen.settled():  # the last chunk's deferred cache fill and commit first
        if state.freed:
            raise SavepointError("the state was freed")
        pages = state.table.all_pages()
        _check_size(gen, state, len(pages))
        idx = torch.tensor(pages, dtype=torch.long, device=gen.device)
        arrays = {name: _to_array(pool[:, idx]) for name, pool in _pools(gen).items()}
        arrays.update(text=_to_array(state.text), cond=_to_array(state.cond),
                      rng=state.rng.get_state().numpy())
        history = []
        for i, rec in enumerate(state.history):
            kb_tail, mouse_tail = rec.tails
            for name, value in (("latents", rec.latents), ("keyboard", rec.keyboard),
                                ("mouse", rec.mouse), ("kb_tail", kb_tail),
                                ("mouse_tail", mouse_tail)):
                if value is not None:
                    arrays[f"h{i}.{name}"] = _to_array(value)
            # NOTE: without context noise the cache fill consumed the latents themselves
            own = rec.context is not None and rec.context is not rec.latents
            if own:
                arrays[f"h{i}.context"] = _to_array(rec.context)
            history.append({"position": rec.position,
                            "context": "own" if own else
                            ("latents" if rec.context is not None else None)})
        entries = []
        for j, entry in enumerate(state.decode.entries):
            if isinstance(entry, torch.Tensor):
                arrays[f"dec.{j}"] = _to_array(entry)
                entries.append("tensor")
            else:
                entries.append(entry)  # None or the decoder's "Rep" marker
        scalars = {
            "prompt": state.prompt, "attention": state.attention,
            "window_chunks": state.table.window_chunks, "needs_recache": state.needs_recache,
            "table": {"num_chunks": state.table.num_chunks,
                      "sink_pages": len(state.table.sink_pages()), "pages": len(pages)},
            "history": history,
            "decode": {"started": state.decode.started, "entries": entries},
        }
    return arrays, scalars


def _record(gen, arrays: dict[str, np.ndarray], i: int, h: dict[str, Any]):
    """Retained chunk ``i`` (CPU float32 tensors, as the stages keep them)."""
    import torch

    from worldstream.engine.backends.matrix_game.stages import MatrixGameChunk

    cpu = torch.device("cpu")

    def get(name):
        key = f"h{i}.{name}"
        return _to_tensor(arrays[key], torch.float32, cpu, key) if key in arrays else None

    latents = get("latents")
    if latents is None or tuple(latents.shape) != gen.latent_shape:
        raise SavepointError(f"the save point's chunk {i} has no latents of "
                             f"{gen.latent_shape}")
    if (get("mouse") is None) == gen.model_config.action.enable_mouse:
        raise SavepointError(f"the save point's chunk {i} does not match this model's mouse "
                             "input")
    context = {"own": get("context"), "latents": latents, None: None}[h["context"]]
    return MatrixGameChunk(latents, int(h["position"]), get("keyboard"), get("mouse"),
                           (get("kb_tail"), get("mouse_tail")), context=context)


def import_matrix_game(gen, arrays: dict[str, np.ndarray], scalars: dict[str, Any]):
    """A new state from :func:`export_matrix_game`'s output, its pages taken from the pool.
    CapacityError when the pool is out of pages, SavepointError for contents that do not fit
    (nothing is held then)."""
    import torch

    from worldstream.engine.backends.matrix_game.state import MatrixGameState
    from worldstream.engine.models.wan.vae_stream import WanDecodeCache, new_decode_cache

    cfg, f = gen.config, gen.pages_per_chunk
    n = int(scalars["table"]["pages"])
    sink = int(scalars["table"]["sink_pages"])
    pools = _pools(gen)
    for name, pool in pools.items():
        want = (pool.shape[0], n, *pool.shape[2:])
        if name not in arrays or arrays[name].shape != want:
            raise SavepointError(f"the save point's pages {name} do not fit this model "
                                 f"({want})")
    if (n - sink) % f or sink not in (0, f):
        raise SavepointError(f"the save point's {n} pages are not whole chunks of {f}")
    tensors = [(pool, _to_tensor(arrays[name], pool.dtype, pool.device, name))
               for name, pool in pools.items()]
    with restored_pages(gen, tensors, scalars, f) as (table, attention):
        history = deque(_record(gen, arrays, i, h)
                        for i, h in enumerate(scalars["history"]))
        text = _to_tensor(arrays["text"], cfg.dtype, gen.device, "text")
        cond = _to_tensor(arrays["cond"], torch.float32, gen.device, "cond")
        want_cond = (cond.shape[0], cfg.cond_frames, *gen.latent_shape[2:])
        if text.ndim != 2 or tuple(cond.shape) != want_cond:
            raise SavepointError(f"the save point's picture conditioning "
                                 f"{tuple(text.shape)}, {tuple(cond.shape)} does not fit "
                                 "this model")
        dec = scalars["decode"]
        entries = [_to_tensor(arrays[f"dec.{j}"], gen.vae_dtype, gen.device, f"dec.{j}")
                   if e == "tensor" else e for j, e in enumerate(dec["entries"])]
        if len(entries) != len(new_decode_cache(gen.vae).entries):
            raise SavepointError("the save point's decoder cache does not fit this model")
        rng = torch.Generator()
        rng.set_state(torch.from_numpy(arrays["rng"].copy()))
        return MatrixGameState(table, str(scalars["prompt"]), text, rng, history,
                               bool(scalars["needs_recache"]), attention=attention,
                               cond=cond, decode=WanDecodeCache(entries,
                                                                bool(dec["started"])))


class MatrixGameSaves:
    """Save points of Matrix-Game 2.0 (:class:`engine.core.backend.SavesState`); its frames
    are decided by the variant (in its name), the DiT's, VAE's and image encoder's tensors, the
    model config, the streaming settings and the default start picture."""

    imports_off_thread = False

    def export_state(self, state):
        return export_matrix_game(self, state)

    def check_saved(self, scalars, layout) -> None:
        pass  # sizes are checked against the pools as the pages are restored

    def import_state(self, arrays, scalars):
        return import_matrix_game(self, arrays, scalars)

    def hash_frames(self, h) -> None:
        import dataclasses
        import json

        from worldstream.engine.studio.savepoint import hash_tensors

        for module in (self.model.transformer, self.vae, self.image_encoder):
            hash_tensors(h, module)
        h.update(json.dumps(dataclasses.asdict(self.model_config), sort_keys=True,
                            default=str).encode())
        settings = dataclasses.asdict(self.config)
        settings.pop("max_states")  # how many states fit, not what they show
        settings.pop("start_image")  # a path: the picture's pixels are hashed instead
        h.update(json.dumps(settings, sort_keys=True, default=str).encode())
        h.update(str(self.vae_dtype).encode())
        h.update(np.ascontiguousarray(self._default_image).tobytes())
