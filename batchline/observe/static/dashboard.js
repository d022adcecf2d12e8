// The batchline dashboard: polls /api/snapshot every second and draws the page from it.
// Vanilla JS, no library, no build step. Every piece of data reaches the DOM as textContent or
// as an attribute value, never as markup.
"use strict";

(() => {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const POLL_MS = 1000;
  const FETCH_TIMEOUT_MS = 5000;
  const MIN_SLOTS = 30; // a chart with few batches keeps bars narrow, the newest on the right
  const FAILED = "failed";
  const CANCELLED = "cancelled";

  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ DOM helpers
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    append(node, children);
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      node.setAttribute(name, String(value));
    }
  }

  function append(node, children) {
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  function replace(node, ...children) {
    node.replaceChildren();
    append(node, children);
  }

  function setText(id, text, title) {
    const node = $(id);
    node.textContent = text;
    if (title === undefined) node.removeAttribute("title");
    else node.title = title;
  }

  function empty(text) {
    return el("p", { class: "empty" }, text);
  }

  // ------------------------------------------------------------------ formatting
  const intFormat = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const oneDecimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  const pad = (n, width = 2) => String(n).padStart(width, "0");

  function fmtInt(n) {
    return isNum(n) ? intFormat.format(n) : "–";
  }

  function fmtRate(r) {
    if (!isNum(r)) return "–";
    return (r < 100 ? oneDecimal : intFormat).format(r) + " /s";
  }

  function fmtMs(ms) {
    if (!isNum(ms)) return "–";
    const abs = Math.abs(ms);
    if (abs < 1000) return `${Math.round(ms)} ms`;
    if (abs < 10000) return `${(ms / 1000).toFixed(2)} s`;
    if (abs < 60000) return `${(ms / 1000).toFixed(1)} s`;
    return fmtSpan(ms);
  }

  function fmtSpan(ms) {
    const s = Math.max(0, Math.round(ms / 1000));
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return s % 60 ? `${m} min ${s % 60} s` : `${m} min`;
    const h = Math.floor(m / 60);
    if (h < 48) return m % 60 ? `${h} h ${m % 60} min` : `${h} h`;
    return `${Math.floor(h / 24)} d ${h % 24} h`;
  }

  function fmtAgo(ms) {
    if (!isNum(ms)) return "";
    const diff = Date.now() - ms;
    if (diff < 1500) return "just now";
    return `${fmtSpan(diff)} ago`;
  }

  function fmtBytes(b) {
    if (!isNum(b)) return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let v = b;
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return i === 0 ? `${Math.round(v)} B` : `${v.toFixed(v < 10 ? 2 : 1)} ${units[i]}`;
  }

  function fmtIso(ms) {
    return isNum(ms) ? new Date(ms).toISOString() : "–";
  }

  function fmtUtcClock(ms) {
    // Batch times are shown in UTC, as their ISO form in the table.
    return isNum(ms) ? fmtIso(ms).slice(11, 19) : "–";
  }

  function fmtLocalClock(date) {
    return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
  }

  function compact(v) {
    if (!isNum(v)) return "";
    const abs = Math.abs(v);
    if (abs >= 1e9) return `${oneDecimal.format(v / 1e9)}G`;
    if (abs >= 1e6) return `${oneDecimal.format(v / 1e6)}M`;
    if (abs >= 1e3) return `${oneDecimal.format(v / 1e3)}k`;
    return oneDecimal.format(v);
  }

  function compactMs(v) {
    if (!isNum(v)) return "";
    if (v === 0) return "0";
    if (Math.abs(v) < 1000) return `${compact(v)} ms`;
    if (Math.abs(v) < 60000) return `${oneDecimal.format(v / 1000)} s`;
    return `${oneDecimal.format(v / 60000)} min`;
  }

  // ------------------------------------------------------------------ reading a record
  const isFailed = (rec) => rec.status === FAILED;
  // Cancelled by a stop before it committed: it runs again at the next start.
  const isCancelled = (rec) => rec.status === CANCELLED;
  const isRetried = (rec) => !isFailed(rec) && !isCancelled(rec) && (rec.attempts || 1) > 1;

  function inputRate(rec) {
    const inputs = rec.inputs || [];
    if (inputs.length) return inputs.reduce((sum, i) => sum + (isNum(i.input_rate) ? i.input_rate : 0), 0);
    if (isNum(rec.records) && rec.batch_interval_ms > 0) return (rec.records * 1000) / rec.batch_interval_ms;
    return null;
  }

  function batchIso(rec) {
    return rec.batch_time_iso || fmtIso(rec.batch_time);
  }

  function statusClass(rec) {
    return isFailed(rec) ? "status-failed" : isRetried(rec) || isCancelled(rec) ? "status-retried" : "status-ok";
  }

  function mean(values) {
    const nums = values.filter(isNum);
    return nums.length ? nums.reduce((a, b) => a + b, 0) / nums.length : null;
  }

  function maxOf(values) {
    const nums = values.filter(isNum);
    return nums.length ? Math.max(...nums) : null;
  }

  function niceCeil(v) {
    if (!isNum(v) || v <= 0) return 1;
    const exp = Math.floor(Math.log10(v));
    const base = 10 ** exp;
    for (const step of [1, 2, 3, 4, 5, 6, 8, 10]) { // halves stay round too
      if (step * base >= v) return step * base;
    }
    return 10 * base;
  }

  // ------------------------------------------------------------------ charts
  const METRICS = [
    { key: "input-rate", title: "Input rate", unit: "records/s", color: "#0e9f8e",
      value: inputRate, format: fmtRate, axis: compact, interval: false },
    { key: "scheduling-delay", title: "Scheduling delay", unit: "ms", color: "#7c5cd6",
      value: (r) => r.scheduling_delay_ms, format: fmtMs, axis: compactMs, interval: false },
    { key: "processing-time", title: "Processing time", unit: "ms", color: "#2f6fde",
      value: (r) => r.processing_ms, format: fmtMs, axis: compactMs, interval: true },
    { key: "total-delay", title: "Total delay", unit: "ms", color: "#3c4a63",
      value: (r) => r.total_delay_ms, format: fmtMs, axis: compactMs, interval: true },
  ];

  function renderTimeline(progress, status) {
    const root = $("timeline");
    if (root.children.length !== METRICS.length) {
      replace(root, METRICS.map((m) => el("div", { class: "chart", "data-metric": m.key },
        el("div", { class: "chart-head" },
          el("span", { class: "chart-title" }, m.title),
          el("span", { class: "chart-unit" }, m.unit)),
        el("div", { class: "chart-figures" },
          el("span", { class: "chart-latest" }, "–"),
          el("span", { class: "chart-stats" }, "")),
        el("div", { class: "chart-plot" }))));
    }
    const interval = status.batch_interval_ms;
    METRICS.forEach((metric, index) => {
      const box = root.children[index];
      const values = progress.map(metric.value);
      const latest = values.length ? values[values.length - 1] : null;
      box.querySelector(".chart-latest").textContent = metric.format(latest);
      const avg = mean(values);
      box.querySelector(".chart-stats").textContent =
        avg === null ? "" : `avg ${metric.format(avg)} · max ${metric.format(maxOf(values))}`;
      const plot = box.querySelector(".chart-plot");
      replace(plot, drawChart(plot.clientWidth || 300, 132, progress, values, metric,
        metric.interval && interval > 0 ? interval : null));
    });
    const first = progress[0];
    const last = progress[progress.length - 1];
    $("timeline-caption").textContent = progress.length
      ? `last ${progress.length} batch${progress.length === 1 ? "" : "es"} · ${fmtUtcClock(first.batch_time)} – ${fmtUtcClock(last.batch_time)} UTC`
      : "";
  }

  function drawChart(width, height, progress, values, metric, threshold) {
    const m = { left: 52, right: 6, top: 8, bottom: 20 };
    const plotW = Math.max(10, width - m.left - m.right);
    const plotH = height - m.top - m.bottom;
    const root = svg("svg", { class: "chart-svg", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": `${metric.title} of the last ${progress.length} batches` });
    if (!progress.length) {
      const base = m.top + plotH + 0.5;
      root.append(svg("line", { class: "axis", x1: m.left, x2: m.left + plotW, y1: base, y2: base }));
      root.append(svg("text", { class: "chart-empty", x: m.left + plotW / 2, y: m.top + plotH / 2 + 4,
        "text-anchor": "middle" }, "no batches yet"));
      return root;
    }
    const dataMax = maxOf(values);
    const yMax = niceCeil(Math.max(dataMax || 0, threshold || 0) * 1.05);
    const y = (v) => m.top + plotH - (Math.max(0, v) / yMax) * plotH;

    // grid and y labels
    for (const frac of [0, 0.5, 1]) {
      const gy = Math.round(y(yMax * frac)) + 0.5;
      root.append(svg("line", { class: frac === 0 ? "axis" : "grid", x1: m.left, x2: m.left + plotW, y1: gy, y2: gy }));
      root.append(svg("text", { class: "tick", x: m.left - 6, y: gy + 3.5, "text-anchor": "end" },
        frac === 0 ? "0" : metric.axis(yMax * frac)));
    }

    const slots = Math.max(progress.length, MIN_SLOTS);
    const slotW = plotW / slots;
    const barW = Math.max(1, Math.min(slotW * 0.72, slotW - 1));
    const x0 = m.left + plotW - progress.length * slotW;

    progress.forEach((rec, i) => {
      const sx = x0 + i * slotW;
      const v = values[i];
      const kind = isFailed(rec) ? "failed" : isRetried(rec) ? "retried" : "ok";
      if (kind !== "ok") {
        root.append(svg("rect", { class: `band band-${kind}`, x: sx, y: m.top, width: slotW, height: plotH }));
      }
      if (isNum(v)) {
        const top = y(v);
        const h = Math.max(v > 0 ? 1 : 0, m.top + plotH - top);
        root.append(svg("rect", { class: `bar bar-${kind}`, x: sx + (slotW - barW) / 2, y: m.top + plotH - h,
          width: barW, height: h, fill: kind === "ok" ? metric.color : null, rx: barW > 4 ? 1 : 0 }));
      }
      const hit = svg("rect", { class: "hit", x: sx, y: m.top, width: slotW, height: plotH });
      const attempts = (rec.attempts || 1) > 1 ? ` · ${rec.attempts} attempts` : "";
      hit.append(svg("title", {}, `${batchIso(rec)}\n${metric.title}: ${metric.format(v)}\n${rec.status}${attempts}`));
      root.append(hit);
    });

    if (threshold && threshold <= yMax) {
      const ty = Math.round(y(threshold)) + 0.5;
      root.append(svg("line", { class: "threshold", x1: m.left, x2: m.left + plotW, y1: ty, y2: ty }));
      root.append(svg("text", { class: "threshold-label", x: m.left + 4, y: ty - 4 }, `interval ${fmtMs(threshold)}`));
    }

    // x labels: the first and the last batch shown
    const first = progress[0];
    const last = progress[progress.length - 1];
    const labelY = height - 5;
    root.append(svg("text", { class: "tick", x: m.left + plotW, y: labelY, "text-anchor": "end" },
      fmtUtcClock(last.batch_time)));
    if (progress.length > 1 && x0 + 60 < m.left + plotW - 60) {
      root.append(svg("text", { class: "tick", x: Math.max(m.left, x0), y: labelY, "text-anchor": "start" },
        fmtUtcClock(first.batch_time)));
    }
    return root;
  }

  function sparkline(values, opts = {}) {
    const w = opts.width || 120;
    const h = opts.height || 28;
    const color = opts.color || "#2f6fde";
    const root = svg("svg", { class: "spark", viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none",
      width: opts.fixed ? w : null, height: h, "aria-hidden": "true" });
    const points = values.map((v, i) => [i, v]).filter(([, v]) => isNum(v));
    if (!points.length) return root;
    const lo = opts.zero ? 0 : Math.min(...points.map(([, v]) => v));
    const hi = Math.max(...points.map(([, v]) => v));
    const span = hi - lo || 1;
    const n = Math.max(values.length - 1, 1);
    const px = (i) => (values.length === 1 ? w : (i / n) * (w - 3) + 1.5);
    const py = (v) => h - 2 - ((v - lo) / span) * (h - 4);
    const line = points.map(([i, v]) => `${px(i).toFixed(1)},${py(v).toFixed(1)}`).join(" ");
    const [firstI] = points[0];
    const [lastI, lastV] = points[points.length - 1];
    root.append(svg("polygon", { class: "spark-area", fill: color,
      points: `${px(firstI).toFixed(1)},${h} ${line} ${px(lastI).toFixed(1)},${h}` }));
    root.append(svg("polyline", { class: "spark-line", stroke: color, points: line }));
    root.append(svg("circle", { class: "spark-dot", fill: color, cx: px(lastI), cy: py(lastV), r: 2 }));
    return root;
  }

  function miniBars(entries, opts = {}) {
    // entries: [{ value, title, kind }]
    const w = opts.width || 300;
    const h = opts.height || 44;
    const root = svg("svg", { class: "minibars", viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none",
      height: h, "aria-hidden": "true" });
    const slots = Math.max(entries.length, opts.minSlots || 20);
    const slotW = w / slots;
    const hi = maxOf(entries.map((e) => (e ? e.value : null))) || 1;
    const x0 = w - entries.length * slotW;
    entries.forEach((e, i) => {
      if (!e || !isNum(e.value)) return;
      const bh = Math.max(1.5, (e.value / hi) * (h - 2));
      const barW = Math.max(2, slotW * 0.7);
      const bar = svg("rect", { class: `minibar minibar-${e.kind || "ok"}`, x: x0 + i * slotW + (slotW - barW) / 2,
        y: h - bh, width: barW, height: bh, fill: e.kind ? null : opts.color || "#2f6fde" });
      if (e.title) bar.append(svg("title", {}, e.title));
      root.append(bar);
    });
    return root;
  }

  // ------------------------------------------------------------------ header and facts
  const STATE_WORDS = { active: "running", stopped: "stopped", finished: "finished" };

  function renderHeader(status, progress) {
    const name = status.name || "pipeline";
    setText("pipeline-name", name);
    setText("pipeline-location", status.location || "");
    document.title = `${name} · batchline`;

    const state = $("pipeline-state");
    const word = STATE_WORDS[status.state] || status.state || "unknown";
    state.textContent = word;
    state.dataset.state = status.state || "";
    state.className = `pill pill-${word}`;

    const latest = progress[progress.length - 1];
    const holder = status.lease_holder || (latest && latest.lease_holder) || null;
    setText("lease-holder", holder || "none", holder || undefined);
    const token = latest && isNum(latest.lease_token) ? `lease token ${latest.lease_token}` : "";
    setText("lease-holder-sub", holder ? token : "no driver holds the lease");
    setText("batch-interval", fmtMs(status.batch_interval_ms));

    if (latest) {
      setText("last-batch", fmtUtcClock(latest.batch_time) + "Z", batchIso(latest));
      const word2 = isRetried(latest) ? `retried (${latest.attempts} attempts)` : latest.status || "completed";
      setText("last-batch-ago", `${fmtAgo(latest.batch_time)} · ${word2}`);
      const rates = progress.map(inputRate);
      setText("latest-rate", fmtRate(rates[rates.length - 1]));
      setText("latest-rate-sub", `${fmtInt(latest.records)} records last batch`);
      setText("latest-delay", fmtMs(latest.total_delay_ms));
      setText("latest-delay-sub", `processing ${fmtMs(latest.processing_ms)}`,
        `scheduling delay ${fmtMs(latest.scheduling_delay_ms)}, processing ${fmtMs(latest.processing_ms)}`);
    } else {
      setText("last-batch", "none yet");
      setText("last-batch-ago", "");
      setText("latest-rate", "–");
      setText("latest-rate-sub", "");
      setText("latest-delay", "–");
      setText("latest-delay-sub", "");
    }

    if (isNum(status.started_at_ms)) {
      setText("started-at", `${fmtUtcClock(status.started_at_ms)}Z`, fmtIso(status.started_at_ms));
      setText("started-at-sub", status.state === "active" ? `up ${fmtSpan(Date.now() - status.started_at_ms)}` : fmtAgo(status.started_at_ms));
    } else {
      setText("started-at", "–");
      setText("started-at-sub", "");
    }
  }

  // ------------------------------------------------------------------ batches table
  function renderBatches(progress) {
    const body = $("batches").tBodies[0];
    const rows = [];
    for (let i = progress.length - 1; i >= 0; i -= 1) {
      const rec = progress[i];
      const kind = isFailed(rec) ? " is-failed" : isRetried(rec) ? " is-retried" : "";
      const inputs = (rec.inputs || []).map((inp) => `${inp.name}: ${fmtInt(inp.records)} records` +
        (inp.dead_letters ? `, ${fmtInt(inp.dead_letters)} dead letters` : "") + (inp.finished ? " (finished)" : ""));
      const attempts = rec.attempts || 1;
      rows.push(el("tr", { class: `batch-row${kind}`, "data-batch-time": rec.batch_time,
        title: inputs.length ? inputs.join("\n") : null },
        el("td", { class: "mono" }, batchIso(rec)),
        el("td", { class: "num" }, fmtInt(rec.records)),
        el("td", { class: `num${rec.dead_letters ? " warn" : " zero"}` }, fmtInt(rec.dead_letters)),
        el("td", { class: `num${rec.late_records ? "" : " zero"}` }, fmtInt(rec.late_records)),
        el("td", { class: "num" }, fmtMs(rec.scheduling_delay_ms)),
        el("td", { class: "num" }, fmtMs(rec.processing_ms)),
        el("td", { class: "num" }, fmtMs(rec.total_delay_ms)),
        el("td", { class: `num${attempts > 1 ? " warn" : ""}` }, fmtInt(attempts)),
        el("td", {}, el("span", { class: `status ${statusClass(rec)}`,
          title: isRetried(rec) ? `completed on attempt ${attempts}` : null }, rec.status || "–"))));
    }
    if (!rows.length) {
      rows.push(el("tr", { class: "placeholder" }, el("td", { colspan: 9 }, "No batch has finished yet.")));
    }
    body.replaceChildren(...rows);
    const failed = progress.filter(isFailed).length;
    const retried = progress.filter(isRetried).length;
    const parts = [`${progress.length} shown, newest first`];
    if (failed) parts.push(`${failed} failed`);
    if (retried) parts.push(`${retried} retried`);
    $("batches-caption").textContent = parts.join(" · ");
  }

  // ------------------------------------------------------------------ side panels
  function renderBacklog(status, progress) {
    const now = isNum(status.backlog) ? status.backlog : (progress.length ? progress[progress.length - 1].backlog : null);
    const series = progress.map((r) => r.backlog);
    const peak = maxOf(series);
    const behind = isNum(now) && now > 0;
    replace($("backlog"),
      el("div", { class: "headline" },
        el("span", { class: `big ${behind ? "big-warn" : "big-ok"}` }, fmtInt(now)),
        el("span", { class: "muted" }, behind
          ? `batch${now === 1 ? "" : "es"} due and not finished`
          : "keeping up: no batch waiting")),
      progress.length ? sparkline(series, { color: behind ? "#d97706" : "#0e9f8e", zero: true, height: 30 }) : null,
      progress.length ? el("div", { class: "caption" },
        el("span", {}, `${fmtUtcClock(progress[0].batch_time)}Z`),
        el("span", {}, `peak ${fmtInt(peak)} in the last ${progress.length} batches`),
        el("span", {}, `${fmtUtcClock(progress[progress.length - 1].batch_time)}Z`)) : null);
  }

  function renderOperators(progress) {
    const names = [];
    for (const rec of progress) {
      for (const op of rec.state_operators || []) if (!names.includes(op.operator)) names.push(op.operator);
    }
    if (!names.length) {
      replace($("operators"), empty("No stateful operator."));
      return;
    }
    const blocks = names.map((name) => {
      const series = progress.map((rec) => (rec.state_operators || []).find((o) => o.operator === name) || null);
      const latest = [...series].reverse().find((o) => o) || {};
      const watermark = isNum(latest.watermark_ms) ? `watermark ${fmtUtcClock(latest.watermark_ms)}Z` : "no watermark";
      const activity = [
        `${fmtInt(latest.updated)} updated`,
        `${fmtInt(latest.removed)} removed`,
        latest.timed_out ? `${fmtInt(latest.timed_out)} timed out` : null,
        latest.late_rows ? `${fmtInt(latest.late_rows)} late` : null,
      ].filter(Boolean).join(" · ");
      return el("div", { class: "operator", "data-operator": name },
        el("div", { class: "operator-head" },
          el("span", { class: "operator-name mono" }, name),
          el("span", { class: "muted small", title: isNum(latest.watermark_ms) ? fmtIso(latest.watermark_ms) : null }, watermark)),
        el("div", { class: "operator-metrics" },
          el("div", { class: "operator-metric" },
            el("div", { class: "label" }, "Keys in state"),
            el("div", { class: "value", "data-field": "state_keys" }, fmtInt(latest.state_keys)),
            sparkline(series.map((o) => (o ? o.state_keys : null)), { color: "#2f6fde" })),
          el("div", { class: "operator-metric" },
            el("div", { class: "label" }, "State size"),
            el("div", { class: "value", "data-field": "state_bytes" }, fmtBytes(latest.state_bytes)),
            sparkline(series.map((o) => (o ? o.state_bytes : null)), { color: "#7c5cd6" }))),
        el("div", { class: "muted small" }, `last batch: ${activity}`));
    });
    replace($("operators"), blocks);
  }

  function renderCheckpoints(progress) {
    const done = progress.filter((r) => r.checkpoint && isNum(r.checkpoint.duration_ms));
    if (!done.length) {
      replace($("checkpoints"), empty(progress.length
        ? `No checkpoint written in the last ${progress.length} batches.` : "No checkpoint yet."));
      return;
    }
    const durations = done.map((r) => r.checkpoint.duration_ms);
    const last = done[done.length - 1].checkpoint;
    const recent = done.slice(-5).reverse();
    replace($("checkpoints"),
      el("div", { class: "headline" },
        el("span", { class: "big" }, fmtMs(last.duration_ms)),
        el("span", { class: "muted" }, `the latest, ${fmtBytes(last.bytes)}`)),
      // one slot per batch, as the backlog's line above: a checkpoint's bar stands where it was reported
      miniBars(progress.map((r) => (r.checkpoint && isNum(r.checkpoint.duration_ms) ? { value: r.checkpoint.duration_ms,
        title: `${fmtIso(r.checkpoint.time)}: ${fmtMs(r.checkpoint.duration_ms)}, ${fmtBytes(r.checkpoint.bytes)}` } : null)),
      { color: "#0e9f8e", minSlots: progress.length, height: 30 }),
      el("div", { class: "caption" },
        el("span", {}, `${done.length} in the last ${progress.length} batches`),
        el("span", {}, `avg ${fmtMs(mean(durations))} · max ${fmtMs(maxOf(durations))}`)),
      el("table", { class: "data compact" },
        el("thead", {}, el("tr", {},
          el("th", { scope: "col" }, "Checkpoint of"),
          el("th", { scope: "col", class: "num" }, "Duration"),
          el("th", { scope: "col", class: "num" }, "Size"))),
        el("tbody", {}, recent.map((r) => el("tr", { class: "checkpoint-row", "data-time": r.checkpoint.time },
          el("td", { class: "mono" }, fmtIso(r.checkpoint.time)),
          el("td", { class: "num" }, fmtMs(r.checkpoint.duration_ms)),
          el("td", { class: "num" }, fmtBytes(r.checkpoint.bytes)))))));
  }

  function renderErrors(progress) {
    const troubled = progress.filter((r) => isFailed(r) || (r.attempts || 1) > 1 || (r.errors || []).length).reverse();
    if (!troubled.length) {
      replace($("errors"), progress.length
        ? el("p", { class: "empty ok" }, `No failed or retried batch in the last ${progress.length}.`)
        : empty("No batch yet."));
      return;
    }
    const shown = troubled.slice(0, 20);
    const items = shown.map((rec) => {
      const failed = isFailed(rec);
      const attempts = rec.attempts || 1;
      const summary = failed
        ? `failed after ${attempts} attempt${attempts === 1 ? "" : "s"}`
        : `completed on attempt ${attempts}`;
      const errors = (rec.errors || []).map((message, i) => {
        const text = String(message);
        const firstLine = text.split("\n", 1)[0];
        const label = (rec.errors.length > 1 ? `attempt ${i + 1}: ` : "") + firstLine;
        return el("li", {}, el("details", {},
          el("summary", { class: "error-text mono" }, label),
          el("pre", { class: "error-full" }, text)));
      });
      return el("li", { class: `error-item ${failed ? "is-failed" : "is-retried"}`, "data-batch-time": rec.batch_time },
        el("div", { class: "error-head" },
          el("span", { class: `status status-${failed ? "failed" : "retried"}` }, failed ? "failed" : "retried"),
          el("span", { class: "mono" }, batchIso(rec)),
          el("span", { class: "muted small" }, summary)),
        errors.length ? el("ul", { class: "error-messages" }, errors) : null);
    });
    const more = troubled.length - shown.length;
    replace($("errors"), el("ul", { class: "error-list" }, items),
      more > 0 ? el("p", { class: "muted small" }, `and ${more} more`) : null);
  }

  function renderExcluded(status, progress) {
    const byId = new Map();
    const latest = progress[progress.length - 1];
    for (const e of [...(latest ? latest.excluded_executors || [] : []), ...(status.excluded_executors || [])]) {
      const prior = byId.get(e.executor_id);
      if (!prior || (isNum(e.since_ms) && e.since_ms < prior.since_ms)) byId.set(e.executor_id, e);
    }
    const executors = [...byId.values()].sort((a, b) => (a.since_ms || 0) - (b.since_ms || 0));
    if (!executors.length) {
      replace($("excluded-executors"), el("p", { class: "empty ok" }, "None: Spark schedules on every executor."));
      return;
    }
    replace($("excluded-executors"), el("table", { class: "data compact" },
      el("thead", {}, el("tr", {},
        el("th", { scope: "col" }, "Executor"),
        el("th", { scope: "col" }, "Host"),
        el("th", { scope: "col" }, "Excluded since"))),
      el("tbody", {}, executors.map((e) => el("tr", { class: "executor-row", "data-executor-id": e.executor_id },
        el("td", { class: "mono" }, e.executor_id),
        el("td", { class: "mono" }, e.host),
        el("td", { class: "nowrap", title: fmtIso(e.since_ms) }, `${fmtUtcClock(e.since_ms)}Z`,
          el("div", { class: "muted small" }, fmtAgo(e.since_ms))))))));
  }

  // What each input gave the newest batch: rates, lag and, for inputs that report them (Kafka),
  // the offset range of every partition and how many records wait beyond it.
  function renderInputs(progress) {
    const latest = new Map();
    for (const rec of progress) {
      for (const input of rec.inputs || []) latest.set(input.name, input);
    }
    if (!latest.size) {
      replace($("inputs"), empty("No batch has run yet."));
      return;
    }
    const rows = [];
    for (const [name, input] of latest) {
      const lag = isNum(input.lag) ? fmtInt(input.lag) : "–";
      rows.push(el("tr", { class: "input-row", "data-input": name },
        el("td", { class: "mono" }, name),
        el("td", { class: "num" }, fmtInt(input.records)),
        el("td", { class: "num" }, fmtInt(Math.round(input.processing_rate || 0))),
        el("td", { class: `num${input.lag ? " warn" : " zero"}` }, lag)));
      const position = input.position || {};
      const offsets = position.offsets || {};
      const behind = position.lag_by_partition || {};
      for (const part of Object.keys(offsets).sort()) {
        const [from, until] = offsets[part];
        rows.push(el("tr", { class: "input-partition-row", "data-partition": part },
          el("td", { class: "mono small muted" }, `  ${part} @ ${from}–${until}`),
          el("td", { class: "num small" }, fmtInt(until - from)),
          el("td", {}, ""),
          el("td", { class: "num small" }, fmtInt(behind[part] || 0))));
      }
    }
    replace($("inputs"), el("table", { class: "data compact" },
      el("thead", {}, el("tr", {},
        el("th", { scope: "col" }, "Input"),
        el("th", { scope: "col" }, "Records"),
        el("th", { scope: "col", title: "records per second of processing time" }, "Rec/s"),
        el("th", { scope: "col", title: "records waiting at the source beyond the batch" }, "Lag"))),
      el("tbody", {}, rows)));
  }

  function renderFinished(status, progress) {
    const since = new Map(); // input -> the first batch that saw it finished
    const all = new Set();
    for (const rec of progress) {
      for (const input of rec.inputs || []) {
        all.add(input.name);
        if (input.finished && !since.has(input.name)) since.set(input.name, rec.batch_time);
      }
    }
    for (const name of status.finished_inputs || []) {
      all.add(name);
      if (!since.has(name)) since.set(name, null);
    }
    const root = $("finished-inputs");
    const parts = [];
    if (status.finished || status.state === "finished") {
      parts.push(el("p", { class: "banner banner-done" }, "Every input has ended: the pipeline finished."));
    }
    if (!since.size) {
      parts.push(empty(all.size ? `None of ${all.size} input${all.size === 1 ? "" : "s"} has ended.` : "No input has ended."));
    } else {
      parts.push(el("ul", { class: "input-list" }, [...since.entries()].map(([name, time]) =>
        el("li", { class: "finished-input", "data-input": name },
          el("span", { class: "check", "aria-hidden": "true" }, "✓"),
          el("span", { class: "mono" }, name),
          el("span", { class: "muted small" }, isNum(time) ? `ended by batch ${fmtUtcClock(time)}Z` : "ended")))));
      if (all.size > since.size) {
        parts.push(el("p", { class: "muted small" }, `${since.size} of ${all.size} inputs ended.`));
      }
    }
    replace(root, parts);
  }

  // ------------------------------------------------------------------ polling
  let lastSnapshot = null;
  let lastText = null;
  let lastSuccess = null;

  function guarded(name, fn) {
    try {
      fn();
    } catch (err) {
      console.error(`batchline dashboard: drawing ${name} failed`, err);
    }
  }

  function render(snapshot, full) {
    const status = snapshot.status || {};
    const progress = Array.isArray(snapshot.progress) ? snapshot.progress.slice(-100) : [];
    guarded("the header", () => renderHeader(status, progress));
    if (!full) return;
    guarded("the timeline", () => renderTimeline(progress, status));
    guarded("the batches", () => renderBatches(progress));
    guarded("the backlog", () => renderBacklog(status, progress));
    guarded("the operators", () => renderOperators(progress));
    guarded("the checkpoints", () => renderCheckpoints(progress));
    guarded("the errors", () => renderErrors(progress));
    guarded("the excluded executors", () => renderExcluded(status, progress));
    guarded("the inputs", () => renderInputs(progress));
    guarded("the finished inputs", () => renderFinished(status, progress));
  }

  function setReachable(ok, detail) {
    const note = $("fetch-error");
    note.hidden = ok;
    if (ok) note.removeAttribute("title");
    else note.title = detail || "";
    document.body.classList.toggle("stale", !ok);
    if (lastSuccess) $("last-update").textContent = `updated ${fmtLocalClock(lastSuccess)}`;
  }

  async function poll() {
    const started = Date.now();
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), FETCH_TIMEOUT_MS);
    try {
      const response = await fetch("/api/snapshot", { cache: "no-store", signal: abort.signal });
      const text = await response.text();
      if (!response.ok) {
        let detail = `HTTP ${response.status}`;
        try {
          detail = JSON.parse(text).error || detail;
        } catch (_) { /* not JSON */ }
        throw new Error(detail);
      }
      const snapshot = JSON.parse(text);
      const changed = text !== lastText;
      lastSnapshot = snapshot;
      lastText = text;
      lastSuccess = new Date();
      render(snapshot, changed); // the header every time (its "ago"s move), the rest when the data changed
      setReachable(true);
    } catch (err) {
      setReachable(false, err && err.name === "AbortError" ? "timed out" : String(err && err.message ? err.message : err));
    } finally {
      clearTimeout(timer);
      setTimeout(poll, Math.max(0, POLL_MS - (Date.now() - started)));
    }
  }

  // The charts are drawn to the pixel width of their box: again when it changes (a window resized,
  // a scroll bar come or gone). Until then CSS scales them, so they never overflow.
  let drawnWidth = null;
  let resizeTimer = null;
  function redrawTimeline() {
    if (lastSnapshot) guarded("the timeline", () =>
      renderTimeline((lastSnapshot.progress || []).slice(-100), lastSnapshot.status || {}));
  }
  function watchWidth() {
    const timeline = $("timeline");
    const check = () => {
      const width = timeline.clientWidth;
      if (width === drawnWidth) return;
      drawnWidth = width;
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(redrawTimeline, 100);
    };
    if (window.ResizeObserver) new ResizeObserver(check).observe(timeline);
    else window.addEventListener("resize", check);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("address").textContent = window.location.host;
    watchWidth();
    poll();
  });
})();
