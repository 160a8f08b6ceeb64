// The dashboard's one script: charts (Chart.js, vendored beside this file), confirmations, live polling.
(() => {
  "use strict";
  const body = document.body;
  const prefix = body.dataset.prefix;
  const pollMs = Number(body.dataset.pollMs) || 2000;
  const $ = (id) => document.getElementById(id);
  const text = (id, v) => { const el = $(id); if (el) el.textContent = v; };

  // Every action asks first (forms carry data-confirm); the CSRF token travels in the form.
  document.querySelectorAll("form[data-confirm]").forEach((f) => {
    f.addEventListener("submit", (e) => { if (!window.confirm(f.dataset.confirm)) e.preventDefault(); });
  });

  // -- charts ------------------------------------------------------------------------------------
  // Vertical dashed lines at category positions (rollbacks between steps).
  const markers = {
    id: "markers",
    afterDatasetsDraw(chart, _args, opts) {
      const xs = (opts && opts.at) || [];
      if (!xs.length) return;
      const { ctx, chartArea: a, scales: { x } } = chart;
      ctx.save();
      ctx.strokeStyle = "#c62828"; ctx.setLineDash([4, 3]); ctx.lineWidth = 1;
      for (const at of xs) {
        const px = at <= 0 ? a.left : at >= x.ticks.length ? a.right
          : (x.getPixelForValue(at - 1) + x.getPixelForValue(at)) / 2;
        ctx.beginPath(); ctx.moveTo(px, a.top); ctx.lineTo(px, a.bottom); ctx.stroke();
      }
      ctx.restore();
    },
  };
  const RED = "#c62828", BLUE = "#2f6fdf", ORANGE = "#ef8a17", GREEN = "#2e7d32", GREY = "#8a929c";
  const opts = (extra) => Object.assign({ animation: false, maintainAspectRatio: true, responsive: true,
    plugins: { legend: { display: true, labels: { boxWidth: 12 } } } }, extra || {});
  const hhmm = (t) => new Date(t * 1000).toLocaleString([], { month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit" });

  function chartConfigs(d) {
    const failed = d.steps.map((s) => s.status === "gate_failed");
    const stepLabels = d.steps.map((s) => `step ${s.id}`);
    const rollbackAt = d.rollbacks.map((r) => r.after_step);
    const out = {
      "chart-score-version": { type: "line", data: {
        labels: d.per_version.map((p) => `v${p.v}`),
        datasets: [{ label: "mean judge score", data: d.per_version.map((p) => p.mean), borderColor: BLUE,
          pointBackgroundColor: d.per_version.map((p) => (p.rollback ? RED : BLUE)), pointRadius: 5 }] },
        options: opts({ scales: { y: { min: -1, max: 1 } } }) },
      "chart-score-time": { type: "line", data: {
        labels: d.over_time.map((p) => hhmm(p.t)),
        datasets: [{ label: "mean judge score", data: d.over_time.map((p) => p.mean), borderColor: GREEN, pointRadius: 4 }] },
        options: opts({ scales: { y: { min: -1, max: 1 } } }) },
      "chart-samples": { type: "bar", data: { labels: stepLabels,
        datasets: [{ label: "samples trained", data: d.steps.map((s) => s.samples),
          backgroundColor: failed.map((f) => (f ? RED : ORANGE)) }] },
        options: opts({ plugins: { markers: { at: rollbackAt }, legend: { display: true } } }) },
      "chart-loss": { type: "line", data: { labels: stepLabels, datasets: [
        { label: "loss", data: d.steps.map((s) => s.loss), borderColor: BLUE,
          pointBackgroundColor: failed.map((f) => (f ? RED : BLUE)), pointRadius: 4 },
        { label: "KL (right axis)", data: d.steps.map((s) => s.kl), borderColor: ORANGE, pointRadius: 3, yAxisID: "kl" },
        { label: "clip fraction", data: d.steps.map((s) => s.clip_frac), borderColor: GREY, pointRadius: 3 }] },
        options: opts({ plugins: { markers: { at: rollbackAt }, legend: { display: true } },
          scales: { y: { position: "left" }, kl: { position: "right", grid: { drawOnChartArea: false } } } }) },
    };
    if (d.simulate.length) {
      out["chart-adoption"] = { type: "line", data: { datasets: d.simulate.map((c, i) => ({
        label: c.label, data: c.points, borderColor: [BLUE, ORANGE, GREEN, RED][i % 4], pointRadius: 4 })) },
        options: opts({ scales: { x: { type: "linear", title: { display: true, text: "interactions" } },
          y: { min: 0, max: 1, title: { display: true, text: "held-out adoption" } } } }) };
    }
    return out;
  }

  function drawCharts(d) {
    for (const [id, cfg] of Object.entries(chartConfigs(d))) {
      const canvas = $(id);
      if (!canvas) continue;
      const old = Chart.getChart(canvas);
      if (old) { old.data = cfg.data; old.options = cfg.options; old.update(); }
      else new Chart(canvas, Object.assign(cfg, { plugins: [markers] }));
    }
  }

  const learning = $("learning-data");
  if (learning) drawCharts(JSON.parse(learning.textContent));

  // -- live updates -------------------------------------------------------------------------------
  let last = null;
  const recent = $("recent");
  let after = recent ? Number(recent.dataset.after) : -1;

  function addTurns(turns) {
    const tbody = recent.tBodies[0];
    for (const t of turns.slice().reverse()) {
      const tr = document.createElement("tr");
      tr.className = "new";
      const cells = [t.id, hhmm(t.created_at), null, t.kind, t.status,
        t.trainable ? "yes" : `no: ${t.reason}`, t.score == null ? "-" : (t.score > 0 ? "+" : "") + t.score];
      cells.forEach((c, i) => {
        const td = document.createElement("td");
        if (i === 2 && !t.session_id) td.textContent = "-";
        else if (i === 2) {
          const a = document.createElement("a");
          a.href = `${prefix}/sessions/${encodeURIComponent(t.session_id)}`;
          a.textContent = t.session_id;
          td.appendChild(a);
        } else td.textContent = c;
        tr.appendChild(td);
      });
      tbody.insertBefore(tr, tbody.firstChild);
      while (tbody.rows.length > 50) tbody.deleteRow(-1);
    }
  }

  async function poll() {
    try {
      const r = await fetch(`${prefix}/api/live?after=${after}`, { cache: "no-store" });
      if (!r.ok) throw new Error(String(r.status));
      const d = await r.json();
      $("live").classList.remove("stale");
      text("live-serving", `v${d.serving}`); text("live-turn", `#${d.ids.turn}`); text("live-step", `#${d.ids.step}`);
      text("turns-today", d.today.turns); text("sessions-today", d.today.sessions);
      text("serving-version", `v${d.serving}`);
      if (recent && d.turns.length) { addTurns(d.turns); after = d.ids.turn; }
      const changed = last && (d.ids.step !== last.step || d.ids.judged !== last.judged || d.ids.event !== last.event);
      if (learning && changed) {
        const lr = await fetch(`${prefix}/api/learning${location.search}`, { cache: "no-store" });  // ?user= kept
        if (lr.ok) drawCharts(await lr.json());
      }
      last = d.ids;
    } catch (_e) {
      $("live").classList.add("stale");
    }
    setTimeout(poll, pollMs);
  }
  poll();
})();
