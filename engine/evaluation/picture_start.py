"""Start from a picture: how close the first second stays to the simulator when the
built-in model starts from a simulator frame of a held-out world, and what it makes of
pictures unlike its world (a sheet of procedural "photos": nothing is downloaded).

``picture_start_psnr_1_16``: a held-out episode's frame ``K`` (after ``K`` frames of play, so
the camera moves) goes through the upload path (PNG bytes ->
:func:`engine.studio.picture.fit_picture`) and starts a stream; frames 1-16 generated with
the episode's next actions are compared with the simulator's frames ``K+1..K+16`` (mean
PSNR, dB). ``picture_start_copy_psnr_1_16`` is the
trivial baseline: the picture itself held for those 16 frames. The model starts with the
camera at rest (a picture carries no velocity) while the simulator's camera may be moving.
"""

from __future__ import annotations

import io

import numpy as np

from worldstream.engine.core.backend import ChunkJob
from worldstream.engine.evaluation.metrics import psnr
from worldstream.engine.studio.picture import fit_picture
from worldstream.engine.worlds.actions import IDLE, direction_to_action

#: frames of play before the picture is taken
PICTURE_AT = 16


def _png(rgb: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def picture_rollout(gen, picture_bytes: bytes, prompt: str, actions: list[int], steps: int,
                    seed: int) -> np.ndarray:
    """Frames ``(len(actions), H, W, 3)`` uint8 generated after starting from the picture
    (PNG/JPEG bytes, fitted to the model's size), one chunk per ``chunk_frames`` actions."""
    f = gen.chunk_frames
    picture = fit_picture(picture_bytes, gen.width)
    state = gen.new_state(prompt, seed, start_frames=np.repeat(picture[None], f, axis=0))
    out = []
    try:
        for c in range(len(actions) // f):
            # the stream's own noise, as a live stream draws it
            (res,) = gen.generate([ChunkJob(state, actions[c * f:(c + 1) * f], steps)])
            if res.error:
                raise res.error
            out.append(res.frames)
    finally:
        gen.free(state)
    return np.concatenate(out)


def picture_start_metrics(gen, episodes, seeds: list[int], steps: int) -> dict[str, float]:
    """``picture_start_psnr_1_16`` and its copy baseline over ``episodes`` (each at least
    ``PICTURE_AT + 17`` frames; see the module docstring)."""
    got, copy = [], []
    for ep, seed in zip(episodes, seeds):
        k = PICTURE_AT
        frames = picture_rollout(gen, _png(ep.frames[k]), ep.prompt, ep.actions[k + 1:k + 17],
                                 steps, seed)
        got += [psnr(frames[i], ep.frames[k + 1 + i]) for i in range(16)]
        copy += [psnr(ep.frames[k], ep.frames[k + 1 + i]) for i in range(16)]
    return {"picture_start_psnr_1_16": round(float(np.mean(got)), 2),
            "picture_start_copy_psnr_1_16": round(float(np.mean(copy)), 2)}


def synthetic_photos(width: int = 320, height: int = 240) -> dict[str, bytes]:
    """Four procedural "photos" unlike the built-in world, as JPEG bytes (4:3, so the upload
    path crops and resizes): a sunset over mountains, a tiled room, a face, a city at night."""
    from PIL import Image, ImageDraw

    photos = {}
    sky = np.linspace([255, 120, 40], [40, 30, 90], height)[:, None, :]
    img = Image.fromarray(np.broadcast_to(sky, (height, width, 3)).astype(np.uint8))
    d = ImageDraw.Draw(img)
    d.ellipse([width * 0.6, height * 0.3, width * 0.75, height * 0.5], fill=(255, 230, 120))
    d.polygon([(0, height), (width * 0.3, height * 0.45), (width * 0.55, height * 0.8),
               (width * 0.8, height * 0.5), (width, height)], fill=(40, 35, 50))
    photos["sunset"] = img
    img = Image.new("RGB", (width, height), (200, 190, 170))
    d = ImageDraw.Draw(img)
    for y in range(0, height, 30):
        for x in range(0, width, 30):
            if (x + y) // 30 % 2:
                d.rectangle([x, y, x + 29, y + 29], fill=(90, 60, 40))
    d.rectangle([width * 0.35, height * 0.2, width * 0.65, height * 0.6], fill=(70, 120, 200))
    photos["room"] = img
    img = Image.new("RGB", (width, height), (120, 160, 120))
    d = ImageDraw.Draw(img)
    cx, cy = width / 2, height / 2
    d.ellipse([cx - 70, cy - 90, cx + 70, cy + 90], fill=(230, 190, 160))
    for ex in (-30, 30):
        d.ellipse([cx + ex - 12, cy - 30, cx + ex + 12, cy - 14], fill=(40, 40, 60))
    d.arc([cx - 35, cy + 10, cx + 35, cy + 50], 20, 160, fill=(150, 40, 40), width=6)
    photos["face"] = img
    img = Image.new("RGB", (width, height), (10, 10, 30))
    d = ImageDraw.Draw(img)
    rng = np.random.default_rng(0)
    for x in range(0, width, 26):
        top = int(rng.integers(height // 4, height - 30))
        d.rectangle([x, top, x + 22, height], fill=(30, 30, 45))
        for wy in range(top + 6, height - 6, 12):
            for wx in (x + 4, x + 13):
                if rng.random() < 0.45:
                    d.rectangle([wx, wy, wx + 4, wy + 5], fill=(250, 220, 120))
    photos["city"] = img
    out = {}
    for name, image in photos.items():
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=92)
        out[name] = buf.getvalue()
    return out


def photo_sheet(gen, path, steps: int = 4, prompt: str = "a green meadow with ponds",
                shown: tuple[int, ...] = (1, 4, 8, 16, 32)) -> str:
    """A PNG sheet: per procedural photo, the fitted picture, then the frames ``shown`` of a
    stream started from it that holds "right" for 16 frames and then idles. Returns the path."""
    from PIL import Image, ImageDraw

    right = direction_to_action(1, 0)
    actions = [right] * 16 + [IDLE] * (max(shown) - 16)
    rows = []
    for data in synthetic_photos().values():
        frames = picture_rollout(gen, data, prompt, actions, steps, seed=0)
        row = [fit_picture(data, gen.width)] + [frames[i - 1] for i in shown]
        rows.append(np.concatenate(row, axis=1))
    sheet = np.concatenate(rows, axis=0)
    title_h = 18
    canvas = Image.new("RGB", (sheet.shape[1], sheet.shape[0] + title_h), (255, 255, 255))
    canvas.paste(Image.fromarray(sheet), (0, title_h))
    labels = ["picture (fitted)"] + [f"frame {i}" for i in shown]
    draw = ImageDraw.Draw(canvas)
    for i, label in enumerate(labels):
        draw.text((i * gen.width + 4, 3), label, fill=(0, 0, 0))
    canvas.save(path)
    return str(path)
