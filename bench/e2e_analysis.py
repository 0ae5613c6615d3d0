"""The figures of one ``bench e2e`` client log: frames matched to their metadata by RTP
timestamp, action-to-photon latency, fps, drops, jitter, per-stage times, corrupted frames,
and the latency-lab export (``bench.analyse`` format)."""

from __future__ import annotations

import numpy as np

from worldstream.bench.e2e_client import ClientLog
from worldstream.bench.stats import match_actions, summarize

RTP_MOD = 2**32
#: a decoded frame this far below the frame sent is corrupted (VP8 at the stream's bitrate
#: keeps 128x128 frames above ~30 dB; a frame decoded against a lost reference falls far below)
CORRUPT_PSNR_DB = 20.0
#: RTP ticks a received timestamp may differ from the one sent: aiortc's encoder rounds the
#: 90 kHz pts on the way
RTP_TOLERANCE = 2


def _nearest(sorted_rtp: np.ndarray, value: int) -> int | None:
    """The sent timestamp within :data:`RTP_TOLERANCE` of ``value``, or None."""
    i = int(np.searchsorted(sorted_rtp, value))
    best = None
    for j in (i - 1, i):
        if 0 <= j < sorted_rtp.size and abs(int(sorted_rtp[j]) - value) <= RTP_TOLERANCE:
            if best is None or abs(int(sorted_rtp[j]) - value) < abs(best - value):
                best = int(sorted_rtp[j])
    return best


def rtp_offset(received_pts: list[int], sent_rtp: list[int]) -> int | None:
    """The offset ``c`` with ``(pts - c) mod 2**32`` in ``sent_rtp`` for the most received
    frames; None when nothing was received or sent.

    NOTE: on an evenly paced stream whose first frames were lost, shifts by whole frame
    intervals match equally well; ties go to 0 (the first frame arrived, the usual case on
    loopback), then to the smallest ``c``. Skipped ticks (engine stalls) break the tie.
    """
    if not received_pts or not sent_rtp:
        return None
    sent = np.unique(np.asarray(sent_rtp, dtype=np.int64))
    best, best_hits = None, -1
    candidates = {(received_pts[0] - r) % RTP_MOD for r in sent_rtp}
    for c in sorted(candidates, key=lambda c: (c != 0, c)):
        hits = sum(_nearest(sent, (p - c) % RTP_MOD) is not None for p in received_pts)
        if hits > best_hits:
            best, best_hits = c, hits
    return best


def jitter_ms(arrivals_ms: list[float], fps: float) -> dict:
    """Inter-arrival jitter: ``std`` of the intervals and p95 of |interval - 1/fps|, ms."""
    if len(arrivals_ms) < 3:
        return {"std_ms": None, "p95_abs_dev_ms": None}
    d = np.diff(np.asarray(arrivals_ms))
    return {"std_ms": float(d.std()),
            "p95_abs_dev_ms": float(np.percentile(np.abs(d - 1000.0 / fps), 95))}


def photon_ms(log: ClientLog, pts: int, t_decoded_ms: float) -> float:
    """When the frame of pts ``pts`` was complete at the client (its marker packet), or its
    decode time when that packet was not seen."""
    if log.rtp_origin is None:
        return t_decoded_ms
    return min(log.complete_ms.get((pts + log.rtp_origin) % RTP_MOD, t_decoded_ms), t_decoded_ms)


def analyse_log(log: ClientLog, fps: float, warmup_s: float = 1.0,
                sent: dict[int, object] | None = None) -> dict:
    """Figures of one client log (see the module docstring); frames received in the first
    ``warmup_s`` after the first frame are left out of fps and jitter (stream start-up).
    ``sent``: frame index -> the rgb the server sent, to count corrupted frames."""
    matched = match_frames(log)
    decoded = match_frames(log, decoded=True)
    seqs = [a["seq"] for a in log.actions]
    times = [a["t_ms"] for a in log.actions]
    lat = match_actions(seqs, times, [m["action_seq"] for _, m in matched],
                        [t for t, _ in matched])
    lat_decoded = match_actions(seqs, times, [m["action_seq"] for _, m in decoded],
                                [t for t, _ in decoded])
    t_frames = [t for _, t in log.frames]
    steady = [t for t in t_frames if t_frames and t >= t_frames[0] + warmup_s * 1e3]
    span_s = (steady[-1] - steady[0]) / 1e3 if len(steady) > 1 else 0.0
    received = {m["index"] for _, m in matched}
    # frames after the last one received may still be in flight when the session closes
    indices = sorted(i for i in {m["index"] for m in log.messages}
                     if received and i <= max(received))
    generated = range(indices[0], indices[-1] + 1) if indices else range(0)
    stages: dict[str, list[float]] = {}
    for t, m in matched:
        for k, v in m.get("stages_ms", {}).items():
            stages.setdefault(k, []).append(v)
        if m.get("queue_ms") is not None:
            stages.setdefault("server_queue", []).append(m["queue_ms"])
        stages.setdefault("encode_transport", []).append(t - m["t_recv_ms"])
    return {
        "action_to_photon_ms": summarize(lat[~np.isnan(lat)]),
        "action_to_decoded_ms": summarize(lat_decoded[~np.isnan(lat_decoded)]),
        **corruption(log, sent),
        "actions_sent": len(seqs), "actions_unanswered": int(np.isnan(lat).sum()),
        "frames_received": len(log.frames), "frames_matched": len(matched),
        "fps": (len(steady) - 1) / span_s if span_s > 0 else 0.0,
        "dropped_frames": len([i for i in generated if i not in received]),
        "frames_generated": len(generated),
        "jitter": jitter_ms(steady, fps),
        "stages_ms": {k: float(np.median(v)) for k, v in stages.items()},
        "first_photon_ms": log.first_photon_ms,
        "errors": log.errors,
    }


def match_frames(log: ClientLog, decoded: bool = False) -> list[tuple[float, dict]]:
    """``(t_photon_ms, frame message)`` of every received frame whose metadata was received
    (RTP timestamp after the offset of :func:`rtp_offset`, within :data:`RTP_TOLERANCE`);
    ``decoded``: the time aiortc decoded it instead (:func:`photon_ms`)."""
    return [(t if decoded else photon_ms(log, pts, t), m) for pts, t, m in _matched(log)]


def _matched(log: ClientLog) -> list[tuple[int, float, dict]]:
    offset = rtp_offset([p for p, _ in log.frames], [m["rtp_ts"] for m in log.messages])
    if offset is None:
        return []
    by_rtp = {m["rtp_ts"]: m for m in log.messages}
    sent = np.unique(np.asarray(list(by_rtp), dtype=np.int64))
    matched = []
    for pts, t in log.frames:
        rtp = _nearest(sent, (pts - offset) % RTP_MOD)
        if rtp is not None:
            matched.append((pts, t, by_rtp[rtp]))
    return matched


def psnr_db(a, b) -> float:
    """PSNR of two uint8 pictures of one shape, dB (inf when identical)."""
    err = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if err == 0 else float(10 * np.log10(255.0**2 / err))


def corruption(log: ClientLog, sent: dict[int, object] | None) -> dict:
    """``corrupted_frames`` (decoded frames under :data:`CORRUPT_PSNR_DB` against the frame
    the server sent with that index), ``frames_checked`` and the PSNR p5/p50 (dB); empty when
    no sent frames or pictures were kept."""
    if not sent or not log.pictures:
        return {}
    scores = []
    for pts, _, m in _matched(log):
        picture, original = log.pictures.get(pts), sent.get(m["index"])
        if picture is not None and original is not None:
            h, w = np.asarray(original).shape[:2]
            scores.append(psnr_db(np.asarray(picture)[:h, :w], original))
    finite = np.asarray([min(v, 99.0) for v in scores])
    return {"corrupted_frames": int((finite < CORRUPT_PSNR_DB).sum()),
            "frames_checked": len(scores),
            "psnr_db_p5": float(np.percentile(finite, 5)) if scores else None,
            "psnr_db_p50": float(np.median(finite)) if scores else None}


def to_export(log: ClientLog) -> list[dict]:
    """The log as a latency-lab export (``bench.analyse`` format)."""
    frames = match_frames(log)
    out = []
    for a in log.actions:
        hit = next(((t, m) for t, m in frames if m["action_seq"] >= a["seq"] and t >= a["t_ms"]),
                   None)
        out.append({"action_seq": a["seq"], "t_action_ms": a["t_ms"], "keys": a["keys"],
                    "t_photon_ms": hit[0] if hit else None,
                    "frame_index": hit[1]["index"] if hit else None,
                    "stages_ms": hit[1].get("stages_ms") if hit else None})
    return out

