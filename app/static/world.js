// worldstream page add-on (issue 15): storyboard editor and player, save points (save, load,
// the list of this page's saves), input log export for exact replay, start from a picture.
// Routes: streaming/PROTOCOL_EXTENSIONS.md ("Stories, save points and replays"). Uses
// play.js's page state (window.worldstream): the session, its token, sendMessage, log.
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const W = { saves: [], story: null, lastLog: null };  // readable by tests as worldstream.world

  const S = () => window.worldstream;
  const sessionPath = (tail) => `/api/sessions/${S().session.session_id}/${tail}`;
  const say = (text, isError) => S().log(text, isError);

  async function call(method, tail, body, contentType) {
    if (!S().session) throw new Error("no session yet");
    const headers = { Authorization: `Bearer ${S().session.token}` };
    if (contentType) headers["Content-Type"] = contentType;
    const r = await fetch(sessionPath(tail), { method, headers, body });
    if (!r.ok) {
      let message = `${r.status}`;
      try { message = (await r.json()).error || message; } catch (e) { /* not JSON */ }
      throw new Error(message);
    }
    return r;
  }

  function download(blob, name) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
  }

  const guard = (fn) => async (...args) => {
    try { await fn(...args); } catch (err) { say(String(err.message || err), true); }
  };

  // ---------------------------------------------------------------- story
  async function playStory() {
    let story;
    try { story = JSON.parse($("ws-story").value); } catch (err) {
      throw new Error(`storyboard: not valid JSON (${err.message})`);
    }
    const r = await call("POST", "story", JSON.stringify(story), "application/json");
    W.story = await r.json();
    W.story.done = false;
    $("ws-story-state").textContent = `beat 1 / ${W.story.beats} · ${W.story.duration_s} s`;
    if (!S().recording) S().sendMessage({ type: "record", on: true });  // the story's MP4
    say(`playing the story: ${W.story.beats} beats, ${W.story.duration_s} s`);
  }

  function onEvent(msg) {
    if (msg.kind === "story" && W.story) {
      if (msg.done) {
        W.story.done = true;
        $("ws-story-state").textContent = `done · ${W.story.beats} beats`;
        if (S().recording) S().sendMessage({ type: "record", on: false });
        say("story done: Download MP4 and Export storyboard");
      } else {
        $("ws-story-state").textContent = `beat ${msg.beat + 1} / ${msg.beats}`;
      }
    }
  }

  function exportStory() {
    JSON.parse($("ws-story").value);  // only valid JSON is exported
    download(new Blob([$("ws-story").value], { type: "application/json" }), "story.json");
  }

  // ---------------------------------------------------------------- save points
  async function savePoint() {
    const r = await call("GET", "state");
    const blob = await r.blob();
    const entry = { at: new Date().toLocaleTimeString(), blob, n: W.saves.length + 1,
      prompt: $("ws-prompt").value };
    W.saves.push(entry);
    const li = document.createElement("li");
    const load = document.createElement("button");
    load.textContent = "load";
    load.onclick = guard(() => loadPoint(entry.blob, `save ${entry.n}`));
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = `worldstream-save-${entry.n}.wsstate`;
    link.textContent = "download";
    li.append(`#${entry.n} ${entry.at} · ${(blob.size / 1e6).toFixed(1)} MB `, load, " ", link);
    $("ws-saves").appendChild(li);
    say(`saved point #${entry.n}`);
  }

  async function loadPoint(blob, name) {
    const r = await call("POST", "state", blob, "application/octet-stream");
    const got = await r.json();
    say(`loaded ${name}: “${got.prompt}”, seed ${got.seed}`);
  }

  // ---------------------------------------------------------------- replay
  async function exportLog() {
    const r = await call("GET", "log");
    W.lastLog = await r.json();
    download(new Blob([JSON.stringify(W.lastLog)], { type: "application/json" }),
      `worldstream-${S().session.session_id}.log.json`);
    say(`input log: ${W.lastLog.events.length} events over ${W.lastLog.frames} frames; `
      + "replay: worldstream generate --replay FILE --out replay.mp4");
  }

  // ---------------------------------------------------------------- picture
  async function startFromPicture(file) {
    if (!["image/png", "image/jpeg"].includes(file.type)) {
      throw new Error(`${file.name}: not a PNG or JPEG picture`);
    }
    await call("POST", "picture", file, file.type);
    say(`started from ${file.name}`);
  }

  async function startFromCurrentFrame() {
    const v = $("ws-video");
    const c = document.createElement("canvas");
    const src = S().transport === "websocket" ? $("ws-canvas") : v;
    c.width = src.videoWidth || src.width;
    c.height = src.videoHeight || src.height;
    c.getContext("2d").drawImage(src, 0, 0);
    const blob = await new Promise((resolve) => c.toBlob(resolve, "image/png"));
    await call("POST", "picture", blob, "image/png");
    say("started from the current frame");
  }

  function mount() {
    S().world = W;
    S().listeners.event.push(onEvent);
    const story = $("ws-story-play");  // a game world has no story and no picture start
    if (story) {
      story.onclick = guard(playStory);
      $("ws-story-export").onclick = guard(exportStory);
    }
    $("ws-save").onclick = guard(savePoint);
    $("ws-load-file").onchange = guard(async (e) => {
      const file = e.target.files[0];
      if (file) await loadPoint(file, file.name);
      e.target.value = "";
    });
    $("ws-log-export").onclick = guard(exportLog);
    if ($("ws-picture")) {
      $("ws-picture").onchange = guard(async (e) => {
        const file = e.target.files[0];
        if (file) await startFromPicture(file);
        e.target.value = "";
      });
      $("ws-picture-frame").onclick = guard(startFromCurrentFrame);
    }
  }

  const waitForPage = setInterval(() => {
    if (window.worldstream && $("ws-save") && $("ws-root").dataset.mounted) {
      clearInterval(waitForPage);
      mount();
    }
  }, 100);
})();
