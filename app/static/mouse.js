// worldstream page add-on (issue 56): mouse look. Reads GET /api/controls; only where the
// model takes mouse input ("mouse": true, e.g. Matrix-Game 2.0 universal) it captures the
// pointer: click the video to lock it (Escape releases it), or drag on the video. The motion
// is summed and sent every FLUSH_MS as an action message's "pointer": [dx, dy] (CSS pixels,
// x right, y down) with the keys held now (streaming/PROTOCOL_EXTENSIONS.md, "Mouse input").
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const FLUSH_MS = 33;             // one message per frame interval at most
  const MAX_DELTA = 2048;          // the server's bound per axis per message (limits.py)
  const MAX_HELD_KEYS = 4;
  const HINT_FREE = "🖱 click the video to capture the mouse (or drag) · Esc releases";
  const HINT_LOCKED = "🖱 mouse captured: move to look · Esc releases";

  const M = { enabled: false, dx: 0, dy: 0, dragging: false, lastX: 0, lastY: 0, sent: 0 };

  function hint(text) {
    let el = $("ws-mouse-hint");
    if (!el) {
      el = document.createElement("span");
      el.id = "ws-mouse-hint";
      // stays visible while the stage has focus (the key hint, .ws-focus, hides then)
      el.style.cssText = "position:absolute;top:8px;left:50%;transform:translateX(-50%);" +
        "font-size:12px;background:rgba(2,6,23,.7);color:#e2e8f0;padding:2px 10px;" +
        "border-radius:6px;pointer-events:none;white-space:nowrap";
      $("ws-stage").appendChild(el);
    }
    el.textContent = text;
  }

  const locked = () => document.pointerLockElement === $("ws-stage");

  function onMove(e) {
    if (locked()) {
      M.dx += e.movementX;
      M.dy += e.movementY;
    } else if (M.dragging) {
      M.dx += e.clientX - M.lastX;
      M.dy += e.clientY - M.lastY;
      M.lastX = e.clientX;
      M.lastY = e.clientY;
    }
  }

  // the motion summed since the last message, within the server's bound (the rest waits)
  function flush() {
    if (!M.dx && !M.dy) return;
    const S = window.worldstream;
    const clip = (v) => Math.max(-MAX_DELTA, Math.min(MAX_DELTA, v));
    const dx = clip(M.dx), dy = clip(M.dy);
    M.dx -= dx;
    M.dy -= dy;
    const t = performance.now();
    const keys = [...S.held].slice(0, MAX_HELD_KEYS);
    if (!S.sendMessage({ type: "action", t, keys, pointer: [dx, dy] })) return;
    S.sentAt.set(S.seq, t);  // the HUD's action-to-photon sample of this action
    M.sent += 1;
    S.listeners.action.forEach((fn) => fn({ seq: S.seq, t, keys, cause: { pointer: [dx, dy] } }));
  }

  function enable(c) {
    const S = window.worldstream;
    S.mouse = M;
    if (!c || !c.mouse) return;
    M.enabled = true;
    const stage = $("ws-stage");
    hint(HINT_FREE);
    stage.addEventListener("click", () => {
      if (!locked() && stage.requestPointerLock) {
        // a browser that refuses the lock (headless, an iframe) still has the drag
        Promise.resolve(stage.requestPointerLock()).catch(() => {});
      }
    });
    stage.addEventListener("mousedown", (e) => {
      if (e.button !== 0 || locked()) return;
      M.dragging = true;
      M.lastX = e.clientX;
      M.lastY = e.clientY;
      e.preventDefault();  // no text selection while dragging
    });
    window.addEventListener("mouseup", () => { M.dragging = false; });
    document.addEventListener("mousemove", onMove);
    document.addEventListener("pointerlockchange", () => hint(locked() ? HINT_LOCKED : HINT_FREE));
    // browsers release the lock on Escape themselves; not every one (headless, kiosks) does
    document.addEventListener("keydown", (e) => {
      if (e.code === "Escape" && locked()) document.exitPointerLock();
    });
    setInterval(flush, FLUSH_MS);
    const list = $("ws-controls-list");
    if (list) {
      const li = document.createElement("li");
      li.textContent = "Mouse: look around (click the video to capture it, Esc releases; or drag)";
      list.appendChild(li);
    }
  }

  const waitForPage = setInterval(() => {
    if (window.worldstream && window.worldstream.sendMessage && $("ws-root")?.dataset.mounted) {
      clearInterval(waitForPage);
      fetch("/api/controls").then((r) => (r.ok ? r.json() : null)).then((c) => {
        // after game.js has listed the world's controls (it sets worldstream.controls)
        let tries = 0;
        const ready = setInterval(() => {
          if ("controls" in window.worldstream || ++tries > 40) {
            clearInterval(ready);
            enable(c);
          }
        }, 50);
      }).catch((err) => window.worldstream.log(`mouse: ${err.message || err}`, true));
    }
  }, 100);
})();
