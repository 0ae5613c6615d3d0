"""Engine events -> server messages, telemetry figures, and the ``play`` command's errors."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from worldstream.app import cli
from worldstream.engine.core.api import Event
from worldstream.engine.core.registry import BackendUnavailableError
from worldstream.streaming.control import event_message
from worldstream.streaming.frames import pad_even
from worldstream.streaming.limits import Limits, RateLimiter
from worldstream.streaming.telemetry import StreamTelemetry


def _image(data_url: str) -> np.ndarray:
    assert data_url.startswith("data:image/jpeg;base64,")
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1]))))


def test_engine_error_event_becomes_error_message():
    msg = event_message(Event("error", {"seq": 4, "code": "invalid", "field": "chunks",
                                        "message": "only 3 chunks of history"}))
    assert msg == {"type": "error", "seq": 4, "code": "invalid", "field": "chunks",
                   "message": "only 3 chunks of history"}


def test_preview_event_per_branch_shows_its_last_frame():
    frames = [np.full((16, 16, 3), v, np.uint8) for v in (10, 240)]
    msg = event_message(Event("preview", {"seq": 2, "fork_id": 1, "branch": 3,
                                          "frames": frames}))
    assert (msg["type"], msg["seq"], msg["fork_id"]) == ("preview", 2, 1)
    [branch] = msg["branches"]
    assert branch["branch"] == 3
    assert abs(int(_image(branch["image"]).mean()) - 240) <= 2


def test_other_events_pass_through():
    msg = event_message(Event("degraded", {"level": 1, "steps": 2, "type": "x"}))
    assert msg == {"type": "event", "kind": "degraded", "level": 1, "steps": 2}


def test_rate_limiter_refills():
    now = [0.0]
    bucket = RateLimiter(2.0, 3, clock=lambda: now[0])
    assert [bucket.allow() for _ in range(4)] == [True, True, True, False]
    now[0] = 0.5                                    # one token back
    assert [bucket.allow() for _ in range(2)] == [True, False]


def test_limits_are_validated():
    with pytest.raises(ValueError, match="max_sessions"):
        Limits(max_sessions=0)


def test_telemetry_gen_ms_excludes_queue_time():
    t = StreamTelemetry()
    t.record(0, {"queue": 500.0, "denoise": 6.0, "decode": 2.0}, 3.0)
    t.record(0, {"queue": 500.0, "denoise": 6.0, "decode": 2.0}, 5.0)  # same chunk
    t.record(1, {"denoise": 10.0}, 7.0)
    snap = t.snapshot()
    assert snap["gen_ms"] == 9.0 and snap["queue_ms_p50"] == 5.0
    assert t.frames_sent == 3


def test_pad_even():
    rgb = np.arange(3 * 5 * 3, dtype=np.uint8).reshape(3, 5, 3)
    out = pad_even(rgb)
    assert out.shape == (4, 6, 3)
    assert (out[:3, :5] == rgb).all() and (out[3, :5] == rgb[2]).all()
    assert (out[:3, 5] == rgb[:, 4]).all()
    with pytest.raises(ValueError):
        pad_even(rgb.astype(np.float32))


def test_play_without_weights_suggests_sim(monkeypatch, capsys):
    def missing(name, **kwargs):
        raise BackendUnavailableError(f"model {name!r}: weights not found (assets/x)")

    monkeypatch.setattr("worldstream.engine.core.registry.load_backend", missing)
    assert cli.main(["play", "--model", "builtin"]) == 2
    err = capsys.readouterr().err
    assert "weights not found" in err and "--model sim" in err


def test_play_rejects_bad_port(capsys):
    assert cli.main(["play", "--port", "0"]) == 2
    assert "--port" in capsys.readouterr().err
