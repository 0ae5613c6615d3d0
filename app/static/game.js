// worldstream page add-on (issue 54): a game world's keys. Reads GET /api/controls
// (streaming/PROTOCOL_EXTENSIONS.md, "Game worlds"); for a game its key map replaces the page's
// WASD / arrows (play.js's worldstream.keyOfCode: KeyboardEvent.code -> the wire key sent), the
// held-key lamps show the game's keys and the Controls box lists what each plays. Other worlds
// answer keys: null and keep theirs. The latency lab cues worldstream.controls' keys.
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const LAMPS = { up: "▲", left: "◀", down: "▼", right: "▶" };
  const NAMES = { ArrowLeft: "←", ArrowRight: "→", ArrowUp: "↑", ArrowDown: "↓" };
  const codeName = (code) => NAMES[code] || code.replace(/^Key|^Digit/, "");

  function showLamps(codesOf) {
    const lamps = document.querySelector(".ws-keys");
    lamps.querySelectorAll("[data-key]").forEach((el) => el.remove());
    for (const [wire, codes] of Object.entries(codesOf)) {
      const el = document.createElement("span");
      el.dataset.key = wire;
      el.textContent = LAMPS[wire] || wire;
      el.title = codes.join(" / ");
      lamps.insertBefore(el, $("ws-status"));
    }
  }

  function listControls(actions, codesOf) {
    const list = $("ws-controls-list");
    if (!list) return;
    list.replaceChildren(...Object.entries(actions || {}).filter(([combo]) => combo)
      .map(([combo, meaning]) => {
        const li = document.createElement("li");
        const keys = combo.split("+").map((w) => (codesOf[w] || [w]).join(" / "));
        li.textContent = `${keys.join(" + ")}: ${meaning}`;
        return li;
      }));
  }

  function apply(c) {
    const S = window.worldstream;
    S.controls = c;
    if (!c || !c.keys) return;
    for (const code of Object.keys(S.keyOfCode)) delete S.keyOfCode[code];
    Object.assign(S.keyOfCode, c.keys);
    const codesOf = {};
    for (const [code, wire] of Object.entries(c.keys)) (codesOf[wire] ||= []).push(codeName(code));
    showLamps(codesOf);
    listControls(c.actions, codesOf);
    $("ws-focus").textContent = "click to play";
    $("ws-stage").title = "click, then play with the keys under Controls";
  }

  const waitForPage = setInterval(() => {
    if (window.worldstream && window.worldstream.keyOfCode && $("ws-root")?.dataset.mounted) {
      clearInterval(waitForPage);
      fetch("/api/controls").then((r) => (r.ok ? r.json() : null)).then(apply)
        .catch((err) => window.worldstream.log(`controls: ${err.message || err}`, true));
    }
  }, 100);
})();
