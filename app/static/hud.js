// worldstream page: the latency HUD (fps, generation, action-to-photon p50/p95, jitter
// buffer, drops, the latency budget) and its chart, refreshed by a stats poll each second
// (the WebRTC jitter buffer from getStats, a ping for the server's stats). Uses play.js's page
// state (window.worldstream); play.js starts S.pollStats.
(() => {
  "use strict";
  const CHART_POINTS = 120;
  const $ = (id) => document.getElementById(id);
  const S = window.worldstream;
  const push = (arr, v, n) => { arr.push(v); if (arr.length > n) arr.shift(); };
  const pct = (values, p) => {
    if (!values.length) return null;
    const sorted = [...values].sort((a, b) => a - b);
    return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
  };

  // ------------------------------------------------------------------ HUD
  // the designed budget (server stats) beside the measured p50 of each stage of recent frames
  function budgetText(b) {
    const keys = [...new Set(S.stageHist.flatMap((s) => Object.keys(s)))];
    const stage = (k) => pct(S.stageHist.map((s) => s[k]).filter((v) => v != null), 50);
    const measured = keys.filter((k) => stage(k) != null)
      .map((k) => `${k} ${stage(k).toFixed(0)}`).join(" · ");
    if (!b) return `latency budget: ${measured || "–"}`;
    return `latency budget: wait ${b.wait_ms.toFixed(0)} + planned chunk ${b.plan_ms.toFixed(0)}`
      + ` ms at ${b.fps} fps (measured p50: ${measured || "–"}; after delivery: cache fill`
      + ` ${b.after_delivery_ms.toFixed(0)})`;
  }

  function updateHud() {
    const p = S.presented;
    const fps = p.length > 1 ? (1000 * (p.length - 1)) / (p[p.length - 1] - p[0]) : 0;
    $("hud-fps").textContent = fps ? fps.toFixed(1) : "–";
    $("hud-gen").textContent = S.genMs != null ? S.genMs.toFixed(1) : "–";
    const p50 = pct(S.a2p, 50), p95 = pct(S.a2p, 95);
    $("hud-a2p").textContent = p50 != null ? `${p50.toFixed(0)} / ${p95.toFixed(0)}` : "–";
    $("hud-jb").textContent = S.transport === "websocket" ? "n/a"
      : S.jitterMs != null ? S.jitterMs.toFixed(0) : "–";
    $("hud-drop").textContent = String(S.dropped ?? 0);
    const b = S.budget;
    if (b) {
      $("hud-mode").textContent = `${b.mode || "custom"} · ${b.chunk_frames} / ${b.steps}`;
      $("hud-floor").textContent = b.floor_ms.toFixed(0);
      if (b.mode) $("ws-mode").value = b.mode;
    }
    $("hud-budget").textContent = budgetText(b);
    push(S.chart, { a2p: p50, jb: S.jitterMs, fps }, CHART_POINTS);
    drawChart();
  }

  function drawChart() {
    const c = $("hud-chart"), g = c.getContext("2d");
    const w = c.width, h = c.height;
    g.clearRect(0, 0, w, h);
    const series = [["a2p", "#f59e0b", "a2p p50 ms"], ["jb", "#38bdf8", "jitter buf ms"]];
    const top = Math.max(50, ...S.chart.flatMap((d) => [d.a2p || 0, d.jb || 0])) * 1.15;
    g.strokeStyle = "#334155"; g.fillStyle = "#94a3b8"; g.font = "10px sans-serif";
    for (const frac of [0.5, 1]) {
      const y = h - frac * (h - 12);
      g.beginPath(); g.moveTo(0, y); g.lineTo(w, y); g.stroke();
      g.fillText(`${Math.round(top * frac)} ms`, 2, y + 10);
    }
    series.forEach(([key, colour, label], i) => {
      g.strokeStyle = colour; g.lineWidth = 1.5; g.beginPath();
      let started = false;
      S.chart.forEach((d, x) => {
        if (d[key] == null) return;
        const px = (x / (CHART_POINTS - 1)) * w, py = h - (d[key] / top) * (h - 12);
        if (started) g.lineTo(px, py); else { g.moveTo(px, py); started = true; }
      });
      g.stroke();
      g.fillStyle = colour; g.fillText(label, w - 190 + i * 95, 10);
    });
  }

  async function pollStats() {
    if (S.transport === "webrtc" && S.pc) {
      const report = await S.pc.getStats();
      report.forEach((s) => {
        if (s.type !== "inbound-rtp" || s.kind !== "video") return;
        const last = S.jbLast;
        if (last && s.jitterBufferEmittedCount > last.count) {
          S.jitterMs = (1000 * (s.jitterBufferDelay - last.delay))
            / (s.jitterBufferEmittedCount - last.count);
        }
        S.jbLast = { delay: s.jitterBufferDelay, count: s.jitterBufferEmittedCount };
        if (s.codecId && report.get(s.codecId)) {
          const codec = report.get(s.codecId).mimeType.split("/")[1];
          S.setBadge(`WebRTC · ${codec}`, "webrtc");
        }
      });
    }
    S.sendMessage({ type: "ping", t: performance.now() });
    updateHud();
  }

  S.pollStats = pollStats;
})();
