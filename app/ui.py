"""The playground page: Gradio Blocks for the frame of the page, and one ``gr.HTML`` block whose
markup the page's own JS (``app/static/play.js``) owns: the <video>, the transports, key
capture, steering controls and the latency HUD. Per-frame and per-key traffic goes over the
WebRTC data channel or the WebSocket, never through Gradio events."""

from __future__ import annotations

import html
import os
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr  # noqa: E402
from fastapi import FastAPI  # noqa: E402

from worldstream.engine.core.limits import MAX_SAY_CHARS  # noqa: E402
from worldstream.engine.worlds.avatar.actions import EXPRESSIONS  # noqa: E402
from worldstream.engine.worlds.avatar.looks import LOOKS  # noqa: E402
from worldstream.engine.worlds.scenes import SCENES  # noqa: E402

DEFAULT_PROMPT = SCENES["meadow"]["prompts"][0]
#: per world: (default prompt, one example prompt per scene or look)
_PROMPTS = {
    "landscape": (DEFAULT_PROMPT, [scene["prompts"][0] for scene in SCENES.values()]),
    "avatar": (LOOKS["office"]["prompts"][0], [look["prompts"][0] for look in LOOKS.values()]),
    # a game has no text prompt: the session's is a placeholder the backend ignores
    "game": ("play", []),
}

_HEAD = ('<link rel="stylesheet" href="/ws-static/play.css">'
         '<script src="/ws-static/play.js" defer></script>'
         '<script src="/ws-static/transports.js" defer></script>'
         '<script src="/ws-static/present.js" defer></script>'
         '<script src="/ws-static/hud.js" defer></script>'
         '<script src="/ws-static/reconnect.js" defer></script>'
         '<script src="/ws-static/ws_media.js" defer></script>'
         '<script src="/ws-static/latency_lab.js" defer></script>'
         '<script src="/ws-static/world.js" defer></script>'
         '<script src="/ws-static/game.js" defer></script>'
         '<script src="/ws-static/mouse.js" defer></script>')
_STORY = Path(__file__).parents[1] / "assets" / "stories" / "five_beats.json"


def _world_html(world: str = "landscape") -> str:
    """Stories, save points, replay export, start from a picture (behaviour:
    ``app/static/world.js``); a game world has save points and replay only (no prompts for a
    story, no picture to start from)."""
    story = html.escape(_STORY.read_text() if _STORY.is_file() else
                        '{"seed": 0, "beats": [{"prompt": "a snowy forest", "duration_s": 5}]}')
    saves = """
    <fieldset><legend>Save points</legend>
      <div class="ws-buttons"><button id="ws-save">Save point</button>
        <label class="ws-file">Load file… <input id="ws-load-file" type="file"
          accept=".wsstate,application/octet-stream"></label></div>
      <ol id="ws-saves" class="ws-saves"></ol>
    </fieldset>
    <fieldset><legend>Replay</legend>
      <div class="ws-buttons"><button id="ws-log-export">Export input log</button></div>
      <small><code>worldstream generate --replay FILE --out replay.mp4</code> makes the same
        frames.</small>
    </fieldset>"""
    if world == "game":
        return saves + """
      <small><code>worldstream record --from-log FILE --out DIR</code> turns an exported log
        into training data.</small>"""
    return f"""
    <fieldset><legend>Storyboard</legend>
      <textarea id="ws-story" rows="8" spellcheck="false">{story}</textarea>
      <div class="ws-buttons"><button id="ws-story-play">▶ Play story</button>
        <button id="ws-story-export">Export storyboard</button>
        <span id="ws-story-state" class="ws-status"></span></div>
      <small>Beats: prompt (or blend), duration_s, transition_s, cut, actions. The story
        starts a fresh world, records itself; Download MP4 when done.</small>
    </fieldset>{saves}
    <fieldset><legend>Start from a picture</legend>
      <div class="ws-buttons"><label class="ws-file">PNG / JPEG… <input id="ws-picture"
          type="file" accept="image/png,image/jpeg"></label>
        <button id="ws-picture-frame">Current frame</button></div>
      <small>Cropped to a square and resized. The built-in model keeps what the picture shows
        while it stays in view, but pictures unlike its world (photos, drawings) will not become
        its world: new ground is its own terrain.</small>
    </fieldset>"""


def _lab_panel_html() -> str:
    """The latency lab's results (behaviour: ``app/static/latency_lab.js``): progress, live
    histogram of action-to-photon latency, p50/p95/count, CSV/JSON export."""
    return """
    <div id="lab-panel" class="lab-panel ws-hidden">
      <div class="lab-head"><b>Latency session</b>
        <span id="lab-progress">0 / 0</span><span id="lab-state" class="lab-state">idle</span>
      </div>
      <div class="lab-stats">
        <div><b id="lab-p50">–</b><small>p50 ms</small></div>
        <div><b id="lab-p95">–</b><small>p95 ms</small></div>
        <div><b id="lab-n">0</b><small>samples</small></div>
        <div><b id="lab-missed">0</b><small>unanswered</small></div>
      </div>
      <canvas id="lab-hist" width="560" height="140"></canvas>
      <div class="lab-export">
        <button id="lab-csv" disabled>Download CSV</button>
        <button id="lab-json" disabled>Download JSON</button>
        <small>JSON: <code>python -m bench analyse session.json</code></small>
      </div>
    </div>"""


def _avatar_html() -> str:
    """The avatar's controls (behaviour: ``play.js``): a say box and one button per expression
    (number keys 1-5 do the same)."""
    buttons = "".join(f'<button data-expression="{name}">{k} {name}</button>'
                      for k, name in enumerate(EXPRESSIONS, 1))
    return f"""
    <fieldset id="ws-avatar"><legend>Avatar</legend>
      <input id="ws-say" maxlength="{MAX_SAY_CHARS}" placeholder="text to say">
      <button id="ws-say-send" class="ws-primary">Say</button>
      <div class="ws-buttons ws-expressions">{buttons}</div>
    </fieldset>"""


def _prompt_html(default: str, examples: str) -> str:
    return f"""
    <fieldset><legend>Scene prompt</legend>
      <input id="ws-prompt" list="ws-examples" maxlength="400" value="{default}">
      <datalist id="ws-examples">{examples}</datalist>
      <label>blend with <input id="ws-blend-text" list="ws-examples" maxlength="400"
        placeholder="second prompt (optional)"></label>
      <label class="ws-row">weight <input id="ws-blend" type="range" min="0" max="1"
        step="0.05" value="0"><output id="ws-blend-value">0.00</output></label>
      <button id="ws-prompt-send" class="ws-primary">Switch prompt</button>
    </fieldset>"""


def _game_html() -> str:
    """A game's controls, filled by ``play.js`` from ``GET /api/controls`` (its key map)."""
    return """
    <fieldset id="ws-controls"><legend>Controls</legend>
      <ul id="ws-controls-list" class="ws-controls"></ul>
      <small>Click the video first. A game ends in its next episode (game over). The keys
        come from the game's action meanings, or from <code>play --keymap FILE</code>.</small>
    </fieldset>"""


def _player_html(world: str = "landscape") -> str:
    default, prompts = _PROMPTS[world]
    examples = "".join(f'<option value="{p}">' for p in prompts)
    avatar = _avatar_html() if world == "avatar" else ""
    steer = _game_html() if world == "game" else _prompt_html(default, examples)
    return f"""
<div id="ws-root" data-default-prompt="{default}" data-world="{world}">
  <div class="ws-stage-col">
    <div id="ws-stage" class="ws-stage" tabindex="0" title="click, then steer with WASD / arrows">
      <video id="ws-video" autoplay muted playsinline></video>
      <canvas id="ws-canvas" class="ws-hidden"></canvas>
      <span id="ws-badge" class="ws-badge">connecting…</span>
      <span id="ws-focus" class="ws-focus">click to steer · WASD / arrows</span>
      <div id="lab-cue" class="lab-cue ws-hidden" aria-live="assertive"></div>
    </div>
    <div class="ws-keys" aria-label="held keys">
      <span data-key="up">▲</span><span data-key="left">◀</span>
      <span data-key="down">▼</span><span data-key="right">▶</span>
      <span id="ws-status" class="ws-status"></span>
    </div>
    <div id="ws-hud" class="ws-hud">
      <div><b id="hud-fps">–</b><small>fps</small></div>
      <div><b id="hud-gen">–</b><small>gen ms / chunk</small></div>
      <div><b id="hud-a2p">–</b><small>action→photon p50 / p95 ms</small></div>
      <div><b id="hud-jb">–</b><small>jitter buffer ms</small></div>
      <div><b id="hud-drop">–</b><small>dropped</small></div>
      <div><b id="hud-mode">–</b><small>mode · chunk frames / steps</small></div>
      <div><b id="hud-floor">–</b><small>floor ms (wait + planned chunk)</small></div>
      <div id="hud-budget" class="ws-budget">latency budget: –</div>
      <canvas id="hud-chart" width="560" height="90"></canvas>
    </div>
    {_lab_panel_html()}
  </div>
  <div class="ws-side">{steer}{avatar}
    <fieldset><legend>Session</legend>
      <label class="ws-row">seed <input id="ws-seed" type="number" min="0" value="0"></label>
      <label class="ws-row">mode <select id="ws-mode"><option value="responsive" selected>
        responsive</option><option value="quality">quality</option></select></label>
      <label class="ws-row">steps <select id="ws-steps"><option>1</option><option selected>2
        </option><option>3</option><option>4</option></select></label>
      <label class="ws-row">transport <select id="ws-transport"><option value="auto">auto
        </option><option value="webrtc">WebRTC</option><option value="websocket">WebSocket
        </option></select></label>
      <div class="ws-buttons">
        <button id="ws-apply">Apply steps</button>
        <button id="ws-restart">Restart</button>
        <button id="ws-rewind">Rewind 2 chunks</button>
      </div>
    </fieldset>
    <fieldset><legend>Futures</legend>
      <div class="ws-buttons"><button id="ws-fork">Preview 4 futures</button></div>
      <div id="ws-previews" class="ws-previews"></div>
    </fieldset>
    <fieldset><legend>Latency lab</legend>
      <label class="ws-row">actions <select id="lab-count"><option>5</option><option>10</option>
        <option selected>20</option><option>50</option></select></label>
      <div class="ws-buttons"><button id="lab-toggle">Start latency session</button></div>
    </fieldset>
    <fieldset><legend>Recording</legend>
      <div class="ws-buttons"><button id="ws-record">● Record</button>
        <a id="ws-download" class="ws-disabled" download>Download MP4</a></div>
    </fieldset>
    {_world_html(world)}
    <div id="ws-log" class="ws-log" role="status"></div>
  </div>
</div>"""


_HELP = {
    "landscape": "Click the video and hold **WASD** or the **arrow keys** to move; type a scene "
                 "prompt to change the world.",
    "avatar": "Click the video and hold **WASD** or the **arrow keys** to turn the head, press "
              "**1-5** for an expression, type text in the say box to make it speak; the prompt "
              "chooses the character and the scene behind it.",
    "game": "Click the video and play the game with the keys listed under **Controls**.",
}


def build_blocks(model_name: str, world: str = "landscape") -> gr.Blocks:
    """The page for ``world`` (``landscape``, ``avatar``: the avatar adds its controls, or
    ``game``: a game's controls, no prompt); ValueError for another world."""
    if world not in _PROMPTS:
        raise ValueError(f"unknown world {world!r}; expected one of {tuple(_PROMPTS)}")
    with gr.Blocks(title="worldstream") as blocks:
        gr.Markdown(f"## worldstream · live world model `{model_name}`\n{_HELP[world]}")
        gr.HTML(_player_html(world), js_on_load=None)
    return blocks


def mount_ui(app: FastAPI, model_name: str, world: str = "landscape") -> FastAPI:
    """Mount the page at ``/`` (call after every API route is registered)."""
    return gr.mount_gradio_app(app, build_blocks(model_name, world), path="/", head=_HEAD,
                               footer_links=[])
