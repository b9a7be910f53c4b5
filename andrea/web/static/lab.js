// The andrea lab page: one view per tab, each fed by a JSON endpoint of the lab server.
// Text from the model or the user is always put in the page as text (textContent), never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const show = (p) => p.replace(/ /g, "␣").replace(/\n/g, "\\n").replace(/\t/g, "\\t").replace(/\r/g, "\\r");
const pct = (p) => (100 * p).toFixed(p >= 0.095 ? 0 : 1) + "%";
const fmt = (x, d = 4) => (Number.isFinite(x) ? x.toFixed(d) : "—");
const FORMS = {
  "id": "named by its id",
  "word-initial": "word-initial form: with the leading space a word has in running text",
  "bare": "the bare piece, as typed",
  "as typed": "as typed",
};
const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["toImage", "sendDataToCloud"] };
const FONT = { family: "system-ui, sans-serif", size: 12 };
let INFO = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

const piece = (p) => el("span", { class: "piece", text: show(p) });

async function api(path, body) {
  const opts = body === undefined ? { method: "GET" }
    : { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) };
  const r = await fetch(path, opts);
  let data;
  try { data = await r.json(); } catch (e) { throw new Error(`the server answered ${r.status} without JSON.`); }
  if (!r.ok || data.error) throw new Error(data.error || `the server answered ${r.status}.`);
  return data;
}

// Run one view's work: a state on the section (loading, ready, error) and the error sentence shown.
async function run(view, work) {
  const section = $(view), error = $(`${view === "generate" ? "gen" : view}-error`);
  error.textContent = "";
  section.dataset.state = "loading";
  try {
    await work();
    section.dataset.state = "ready";
  } catch (e) {
    error.textContent = e.message;
    section.dataset.state = "error";
  }
}

function intField(id, { optional = false } = {}) {
  const v = $(id).value.trim();
  if (v === "" && optional) return null;
  const n = Number(v);
  return Number.isFinite(n) ? n : v;  // the server says what is wrong with a value that is not a number
}

// ---------------------------------------------------------------- tabs

const drawn = {};
const DRAW = {};

function select(view) {
  if (!DRAW[view]) view = "lesson";
  for (const b of document.querySelectorAll("nav button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll("section.view")) s.hidden = s.id !== view;
  if (location.hash !== "#" + view) history.replaceState(null, "", "#" + view);
  if (!drawn[view]) { drawn[view] = true; DRAW[view](); }
  else for (const p of $(view).querySelectorAll(".js-plotly-plot")) Plotly.Plots.resize(p);
}

// ---------------------------------------------------------------- 0. the lesson

const VERDICT_CLASS = { "holds": "holds", "holds with a caveat": "caveat", "does not hold here": "fails", "cannot check": "cannot" };

let WALK = "embedding";
const LESSONS = {};

DRAW.lesson = () => run("lesson", async () => {
  for (const b of document.querySelectorAll(".walks button")) b.classList.toggle("active", b.dataset.walk === WALK);
  const r = LESSONS[WALK] || (LESSONS[WALK] = await api(WALK === "embedding" ? "/api/lesson" : `/api/lesson/${WALK}`));
  const list = $("lesson-steps");
  list.replaceChildren();
  list.dataset.walk = WALK;
  for (const s of r.steps) {
    const li = el("li", { "data-key": s.key, "data-verdict": s.verdict },
      el("div", { class: "claim", text: s.claim }),
      el("div", { class: "how", text: s.how }));
    list.append(li);
    const figure = (LESSON_FIGURES[WALK] || {})[s.key];
    if (figure && s.verdict !== "cannot check") figure(li, s.numbers, r.config);
    li.append(el("div", { class: `verdict ${VERDICT_CLASS[s.verdict] || ""}`, text: s.verdict + (s.why ? `: ${s.why}` : "") }));
  }
});

function lessonPlot(li, traces, layout, wide = false) {
  const div = el("div", { class: wide ? "figure wide" : "figure" });
  li.append(div);
  Plotly.react(div, traces, { font: FONT, margin: { l: 56, r: 10, t: 30, b: 44 }, showlegend: traces.length > 1, ...layout }, PLOT_CONFIG);
}

const PLOT_TITLE = (text) => ({ text, font: { size: 12 }, x: 0.01, xanchor: "left" });

// What each step draws: step key -> (li, numbers, config) adding a figure to the step's item.
const LESSON_FIGURES = {
  embedding: {
    init: (li, n) => {
      const h = n.histogram, width = h.edges[1] - h.edges[0];
      const mids = h.counts.map((_, i) => (h.edges[i] + h.edges[i + 1]) / 2);
      const sd = n.expected_std, normal = mids.map((x) => h.values * width * Math.exp(-0.5 * (x / sd) ** 2) / (sd * Math.sqrt(2 * Math.PI)));
      lessonPlot(li, [{ type: "bar", x: mids, y: h.counts, name: `wte at step ${n.step}`, marker: { color: "#93c5fd" } },
        { type: "scatter", mode: "lines", x: mids, y: normal, name: `N(0, 1/√d): sd ${sd.toFixed(4)}`, line: { color: "#b91c1c" } }],
      { title: PLOT_TITLE("the table's values at its first snapshot against N(0, 1/√d)"), bargap: 0,
        xaxis: { title: { text: "value" } }, yaxis: { title: { text: "values" } } });
    },
    pairs: (li, n) => {
      const c = n.cos.input_centred, pairs = Object.keys(c);
      lessonPlot(li, [{ type: "bar", x: pairs, y: pairs.map((p) => c[p]), marker: { color: pairs.map((p, i) => (i < 2 ? "#2563eb" : "#94a3b8")) },
        text: pairs.map((p) => fmt(c[p], 3)), textposition: "outside", hovertemplate: "%{x}: cos %{y:.3f}<extra></extra>" }],
      { title: PLOT_TITLE(`cos θ on the centred input table; grey band: random rows, ±1/√d = ±${n.band.toFixed(3)}`),
        yaxis: { title: { text: "cos θ" }, zeroline: true },
        shapes: [{ type: "rect", xref: "paper", x0: 0, x1: 1, y0: -n.band, y1: n.band, fillcolor: "#e5e7eb", opacity: 0.6, line: { width: 0 }, layer: "below" }] });
    },
    scores: (li, n) => {
      const ws = n.sets.wordsim353.input, group = ws.standalone.points ? ws.standalone : ws.single;
      if (!group.points || !group.points.length) return;
      lessonPlot(li, [{ type: "scatter", mode: "markers", x: group.points.map((p) => p[2]), y: group.points.map((p) => p[3]),
        text: group.points.map((p) => `${p[0]}·${p[1]}`), marker: { size: 6, color: "#2563eb", opacity: 0.7 },
        hovertemplate: "%{text}<br>people %{x}<br>cos %{y:.3f}<extra></extra>" }],
      { title: PLOT_TITLE(`WordSim-353: this model's cos θ against people's ratings, ${group.n} pairs, ρ ${fmt(group.rho, 2)}`),
        xaxis: { title: { text: "people's rating" } }, yaxis: { title: { text: "cos θ, centred input table" } } });
    },
  },
  attention: {
    scores: (li, n) => {
      const labels = n.tokens.map((p, t) => `${t}:${p}`), head = n.spread.indexOf(Math.max(...n.spread));
      const panels = [["q·k/√d_head", n.scaled[head]], ["masked", n.masked[head]], ["softmax", n.pattern[head]]];
      const traces = panels.map(([name, z], i) => ({ type: "heatmap", z, x: labels, y: labels, xaxis: `x${i + 1}`, yaxis: "y",
        colorscale: i === 2 ? "Blues" : "RdBu", reversescale: i === 2, showscale: false, name,
        hovertemplate: `${name}<br>query %{y}<br>key %{x}<br>%{z:.3f}<extra></extra>` }));
      const axes = {};
      panels.forEach(([name], i) => { axes[`xaxis${i + 1}`] = { domain: [i / 3 + 0.02, (i + 1) / 3 - 0.02], type: "category", showticklabels: false, title: { text: name } }; });
      lessonPlot(li, traces, { title: PLOT_TITLE(`block 1, head ${head + 1}: the scores, then the mask (−∞ above the diagonal, blank), then the softmax`),
        ...axes, yaxis: { autorange: "reversed", type: "category", tickfont: { size: 9 } } }, true);
    },
    scale: (li, n) => {
      const dims = Object.keys(n.random), x = dims.map((d) => `random, d_head ${d}`).concat(["this model's block 1"]);
      lessonPlot(li, [{ type: "bar", name: "before: q·k", x, y: dims.map((d) => n.random[d].before).concat([n.model_before]) },
        { type: "bar", name: "after: q·k/√d_head", x, y: dims.map((d) => n.random[d].after).concat([n.model_after]) }],
      { title: PLOT_TITLE("the spread of the scores before and after dividing by √d_head"), barmode: "group", yaxis: { title: { text: "standard deviation" } } });
    },
    heads: (li, n) => {
      const L = n.scores.previous.length, H = n.scores.previous[0].length, x = [];
      for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) x.push(`b${l + 1}h${h + 1}`);
      const traces = Object.entries(n.scores).map(([kind, s]) => ({ type: "bar", name: kind, x, y: s.flat() }));
      lessonPlot(li, traces, { title: PLOT_TITLE(`each head's mean weight of each kind on a repeated random sequence; a kind is present above ${n.threshold}`),
        barmode: "group", yaxis: { title: { text: "mean weight" }, range: [0, 1] },
        shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: n.threshold, y1: n.threshold, line: { dash: "dot", color: "#b91c1c" } }] }, true);
      const box = el("div", { class: "patterns" });
      n.example.patterns.forEach((layer, l) => layer.forEach((grid, h) => {
        const canvas = el("canvas", { title: `block ${l + 1}, head ${h + 1} on BOS + r + r` });
        drawSmall(canvas, grid);
        box.append(el("figure", {}, canvas, el("figcaption", { text: `b${l + 1}h${h + 1}` })));
      }));
      li.append(box);
    },
    ablation: (li, n) => {
      const x = [], y = [];
      n.costs.forEach((row, l) => row.forEach((c, h) => { x.push(`b${l + 1}h${h + 1}`); y.push(c); }));
      lessonPlot(li, [{ type: "bar", x, y, marker: { color: y.map((c) => (c >= n.min_cost ? "#2563eb" : "#94a3b8")) },
        hovertemplate: "%{x}: %{y:+.4f} bits per byte<extra></extra>" }],
      { title: PLOT_TITLE(`held-out bits per byte each head's removal costs (whole: ${fmt(n.base_bpb)})`), yaxis: { title: { text: "cost, bits per byte" } } });
    },
    later: (li, n) => {
      lessonPlot(li, [{ type: "scatter", mode: "lines", x: n.by_position.map((_, t) => t), y: n.by_position, line: { color: "#2563eb" } }],
        { title: PLOT_TITLE("held-out loss by position in the window"), xaxis: { title: { text: "position" } }, yaxis: { title: { text: "nats per token" } } });
    },
  },
  block: {
    mlp: (li, n) => {
      const h = n.prompt_hidden;
      lessonPlot(li, [{ type: "heatmap", z: h.values, x: h.units.map((u) => `unit ${u}`), y: h.tokens.map((p, t) => `${t}:${p}`),
        colorscale: "Blues", reversescale: true, hovertemplate: "%{y}<br>%{x}: %{z:.3f}<extra></extra>" }],
      { title: PLOT_TITLE(`block 1's MLP on the prompt: the ${h.units.length} most active of ${n.hidden_width} hidden units, token by token (0: not firing)`),
        xaxis: { type: "category", showticklabels: false, title: { text: "hidden unit" } }, yaxis: { autorange: "reversed", type: "category", tickfont: { size: 9 } } }, true);
    },
    stream: (li, n) => {
      lessonPlot(li, [{ type: "scatter", mode: "lines+markers", x: n.stages, y: n.norms, name: "the stream's mean row norm", line: { color: "#2563eb" } },
        { type: "bar", x: n.stages.slice(1), y: n.blocks.map((b) => b.attention), name: "attention adds", marker: { color: "#f59e0b" }, opacity: 0.7 },
        { type: "bar", x: n.stages.slice(1), y: n.blocks.map((b) => b.mlp), name: "the MLP adds", marker: { color: "#16a34a" }, opacity: 0.7 }],
      { title: PLOT_TITLE("the residual stream's size after each stage, and the size of what each block adds"), barmode: "group",
        xaxis: { type: "category" }, yaxis: { title: { text: "mean row norm" } } });
    },
    lens: (li, n) => {
      lessonPlot(li, [{ type: "scatter", mode: "lines+markers", x: n.stages, y: n.bpb, line: { color: "#2563eb" },
        hovertemplate: "%{x}: %{y:.3f} bits per byte<extra></extra>" }],
      { title: PLOT_TITLE("held-out bits per byte read through ln_f and the head at each stage (the logit lens)"),
        xaxis: { type: "category" }, yaxis: { title: { text: "bits per byte" } } });
    },
    removal: (li, n) => {
      const x = n.costs.attention.map((_, i) => `block ${i + 1}`);
      lessonPlot(li, [{ type: "bar", name: "attention removed", x, y: n.costs.attention, marker: { color: "#f59e0b" } },
        { type: "bar", name: "MLP removed", x, y: n.costs.mlp, marker: { color: "#16a34a" } }],
      { title: PLOT_TITLE(`held-out bits per byte each part's removal costs (whole: ${fmt(n.base_bpb)})`), barmode: "group",
        yaxis: { title: { text: "cost, bits per byte" } },
        shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: n.min_cost, y1: n.min_cost, line: { dash: "dot", color: "#b91c1c" } }] });
    },
    head: (li, n) => {
      if (!n.cat) return;
      const near = n.cat.neighbours.slice().reverse();
      lessonPlot(li, [{ type: "bar", orientation: "h", x: near.map((t) => t.cos), y: near.map((t) => t.piece.replace(/ /g, "␣")),
        marker: { color: "#16a34a" }, hovertemplate: "%{y}: cos %{x:.3f}<extra></extra>" }],
      { title: PLOT_TITLE("the output rows closest to cat's (cos θ on the head's table)"), margin: { l: 110, r: 10, t: 30, b: 44 },
        yaxis: { type: "category" }, xaxis: { title: { text: "cos θ" } } });
    },
    params: (li, n) => {
      const names = [n.reference, "this model"], parts = [n[n.reference], n.model];
      lessonPlot(li, [{ type: "bar", name: "the blocks", x: names, y: parts.map((p) => p.blocks_share * 100), marker: { color: "#94a3b8" } },
        { type: "bar", name: "the two tables and the head", x: names, y: parts.map((p) => (p.tables / p.total) * 100), marker: { color: "#2563eb" } }],
      { title: PLOT_TITLE("where the parameters live, in per cent of each model's total"), barmode: "stack", yaxis: { title: { text: "%" }, range: [0, 100] } });
    },
  },
};

// ---------------------------------------------------------------- 1. parameters

DRAW.params = () => run("params", async () => {
  const preset = $("params-preset").value || null;
  const r = await api("/api/params", { preset });
  const body = $("params-table").tBodies[0];
  body.replaceChildren();
  for (const row of r.rows) {
    const share = row.share >= 0.001 ? (100 * row.share).toFixed(2) + "%" : (100 * row.share).toFixed(4) + "%";
    body.append(el("tr", { class: row.part ? "" : "sum" }, el("td", { text: row.name }), el("td", { text: row.shape }),
      el("td", { text: row.count.toLocaleString("en") }), el("td", { text: share })));
  }
  const parts = r.rows.filter((x) => x.part).reverse();
  Plotly.react("params-chart", [{
    type: "bar", orientation: "h", x: parts.map((x) => x.count), y: parts.map((x) => x.name),
    text: parts.map((x) => `${x.count.toLocaleString("en")} (${(100 * x.share).toFixed(1)}%)`), textposition: "auto",
    hovertemplate: "%{y}<br>%{x:,} parameters<extra></extra>",
    marker: { color: parts.map((x) => (x.name.includes("embedding") ? "#2563eb" : x.name.includes("head") ? "#16a34a" : "#94a3b8")) },
  }], { title: { text: r.name, font: { size: 13 }, x: 0.01, xanchor: "left" }, margin: { l: 170, r: 20, t: 40, b: 40 }, font: FONT,
    xaxis: { title: { text: "parameters" } } }, PLOT_CONFIG);
});

// ---------------------------------------------------------------- 2. token table

function describeLookup(w) {
  const out = [el("b", { text: JSON.stringify(w.query) }), " → "];
  if (w.single) out.push("token ", el("b", { text: String(w.ids[0]) }), " ", piece(w.pieces[0]));
  else out.push(piece(w.text), `: the mean of ${w.ids.length} tokens`);
  out.push(" ", el("span", { class: "form", text: `· ${FORMS[w.form]}` }));
  return out;
}

function neighbourList(list, items, metric) {
  list.replaceChildren();
  const top = Math.max(...items.map((n) => Math.abs(n.score)), 1e-12);
  for (const n of items) {
    const used = n.standalone_share === undefined ? "" : n.standalone_share === null ? "; never seen in training"
      : `; stands alone in ${Math.round(100 * n.standalone_share)}% of its uses`;
    const pick = el("button", { type: "button", title: `token ${n.id}${used}: look it up`, onclick: () => {
      $("token-word").value = "#" + n.id;
      DRAW.token();
    } }, piece(n.piece));
    list.append(el("li", { "data-id": n.id }, pick, el("span", { class: "score", text: (metric === "cos" ? n.score.toFixed(3) : n.score.toFixed(2)) }),
      el("span", { class: "bar", style: `width:${Math.round(80 * Math.abs(n.score) / top)}px` })));
  }
  if (!items.length) list.append(el("li", { text: "no token qualifies." }));
}

DRAW.token = () => run("token", async () => {
  const metric = $("token-metric").value;
  const r = await api("/api/token", { word: $("token-word").value, bare: $("token-bare").checked,
    whole_words: $("token-whole").checked, metric, k: intField("token-k") });
  const box = $("token-lookup");
  box.replaceChildren(el("div", {}, ...describeLookup(r.word)),
    el("div", { text: `row norm ‖u‖: ${fmt(r.norms.input)} in the input table, ${fmt(r.norms.output)} in the output head` +
      (r.whole_words ? ` · neighbours limited to whole words (${r.whole_words_rule})` : "") }));
  if (r.word.note) box.append(el("div", { class: "note", text: r.word.note }));
  // a row learns what its token does in use: say how this one is used in the run's training text
  if (r.usage_line) box.append(el("div", { id: "token-usage", class: "note", text: r.usage_line }));
  // and how the word is encoded there: one token in how many of its occurrences (coverage, purity)
  if (r.word_line) box.append(el("div", { id: "token-words", class: "note", text: r.word_line }));
  neighbourList($("token-input-list"), r.neighbours.input, metric);
  neighbourList($("token-output-list"), r.neighbours.output, metric);
});

// ---------------------------------------------------------------- 3. compare

function planePlot(node, r, which) {
  const s = r[which], u = s.plane.u, v = s.plane.v;
  const lim = Math.max(Math.abs(u[0]), Math.abs(u[1]), Math.abs(v[0]), Math.abs(v[1]), 1e-9) * 1.25;
  const arrow = (p, color) => ({ x: p[0], y: p[1], ax: 0, ay: 0, xref: "x", yref: "y", axref: "x", ayref: "y",
    showarrow: true, arrowhead: 2, arrowwidth: 2.2, arrowcolor: color, text: "" });
  Plotly.newPlot(node, [{
    type: "scatter", mode: "text+markers", x: [u[0], v[0]], y: [u[1], v[1]], text: [r.a.label, r.b.label],
    textposition: "top center", marker: { size: 6, color: ["#2563eb", "#dc2626"] },
    hovertemplate: "%{text}: (%{x:.3f}, %{y:.3f})<extra></extra>",
  }], { title: { text: `${which === "input" ? "input table" : "output head"}: θ = ${fmt(s.angle_deg, 1)}°`, font: { size: 12 }, x: 0.01, xanchor: "left" },
    margin: { l: 36, r: 10, t: 30, b: 26 }, font: FONT, showlegend: false, annotations: [arrow(u, "#2563eb"), arrow(v, "#dc2626")],
    xaxis: { range: [-lim, lim], zeroline: true }, yaxis: { range: [-lim, lim], scaleanchor: "x", zeroline: true } }, PLOT_CONFIG);
}

function compareCard(r) {
  const rows = [["‖u‖", "norm_u", 4], ["‖v‖", "norm_v", 4], ["u·v", "dot", 4], ["cos θ", "cos", 4], ["θ (degrees)", "angle_deg", 2]];
  const table = el("table", { class: "numbers" }, el("thead", {}, el("tr", {}, el("th", { text: "" }),
    el("th", { text: "input (wte)" }), el("th", { text: "output (lm_head)" }))));
  const body = el("tbody");
  for (const [label, key, d] of rows) body.append(el("tr", { "data-key": key }, el("td", { text: label }),
    el("td", { text: fmt(r.input[key], d) }), el("td", { text: fmt(r.output[key], d) })));
  table.append(body);
  const plots = [el("div", { class: "plane" }), el("div", { class: "plane" })];
  const notes = [r.a.note, r.b.note].filter(Boolean).map((n) => el("div", { class: "note", text: n }));
  const card = el("div", { class: "card" },
    el("div", {}, "u: ", ...describeLookup(r.a)), el("div", {}, "v: ", ...describeLookup(r.b)), ...notes,
    el("div", { class: "plots" }, table, ...plots));
  $("compare-results").append(card);
  planePlot(plots[0], r, "input");
  planePlot(plots[1], r, "output");
}

async function comparePairs(pairs) {
  $("compare-results").replaceChildren();
  $("compare-verdict").textContent = "";
  const bare = $("compare-bare").checked;
  const results = [];
  for (const [a, b] of pairs) results.push(await api("/api/compare", { a, b, bare }));
  results.forEach(compareCard);
  return results;
}

DRAW.compare = () => run("compare", () => comparePairs([[$("compare-a").value, $("compare-b").value]]));

function lesson() {
  return run("compare", async () => {
    // the pairs come from the server (andrea.inside.wordsim): the related ones first, then the unrelated
    const pairs = INFO.lesson_pairs, n = INFO.lesson_related;
    const results = await comparePairs(pairs);
    const say = (which) => {
      const name = which === "input" ? "input table" : "output head";
      const cos = results.map((r) => r[which].cos);
      const part = (i) => `${pairs[i].join("·")} ${fmt(cos[i], 3)}`;
      const related = pairs.slice(0, n).map((_, i) => part(i)).join(", ");
      const unrelated = pairs.slice(n).map((_, i) => part(n + i)).join(", ");
      const apart = Math.min(...cos.slice(0, n)) > Math.max(...cos.slice(n));
      return `${name}: cos ${related} ${apart ? "all above" : "not all above"} ${unrelated}`;
    };
    $("compare-verdict").textContent = `${say("input")}; ${say("output")}.`;
  });
}

// ---------------------------------------------------------------- 4. map

DRAW.map = () => run("map", async () => {
  const words = $("map-words").value.split(/[,\n]+/).map((w) => w.trim()).filter(Boolean);
  const body = { method: $("map-method").value, table: $("map-table").value, bare: $("map-bare").checked };
  if (words.length) body.words = words; else body.top = intField("map-top");
  const r = await api("/api/map", body);
  const labels = r.points.map((p) => p.label);
  const many = r.points.length > 150;
  Plotly.react("map-plot", [{
    type: "scatter", mode: many ? "markers" : "markers+text", x: r.points.map((p) => p.x), y: r.points.map((p) => p.y),
    text: labels, textposition: "top center", customdata: r.points.map((p) => (p.single ? `token ${p.ids[0]}` : `mean of ${p.ids.length} tokens`)),
    hovertemplate: "%{text}<br>%{customdata}<extra></extra>",
    marker: { size: 7, color: r.points.map((p) => (p.single ? "#2563eb" : "#ea580c")) },
  }], { margin: { l: 50, r: 20, t: 20, b: 44 }, font: FONT, hovermode: "closest", dragmode: "zoom",
    xaxis: { title: { text: r.method === "pca" ? `PC 1 (${(100 * r.explained[0]).toFixed(1)}% of variance)` : "t-SNE 1" } },
    yaxis: { title: { text: r.method === "pca" ? `PC 2 (${(100 * r.explained[1]).toFixed(1)}% of variance)` : "t-SNE 2" } },
  }, PLOT_CONFIG);
  const what = body.words ? `${r.points.length} chosen words` : `the ${r.points.length} most used tokens`;
  const how = r.method === "pca" ? "first two principal components" : "t-SNE: near neighbours stay near; the axes and far distances carry no meaning";
  const split = r.points.filter((p) => !p.single).length;
  $("map-note").textContent = `${what}, ${r.table === "input" ? "input table" : "output head"}, ${how}.` +
    (split ? ` ${split} word${split > 1 ? "s are" : " is"} not one token (orange: the mean of its tokens' rows).` : "");
});

// ---------------------------------------------------------------- 5. positions

DRAW.positions = () => run("positions", async () => {
  const r = await api("/api/positions");
  $("positions-note").textContent = r.note;
  if (r.table === null) {
    $("positions-heatmap").replaceChildren(el("p", { class: "note", text: "There is no position table to compare." }));
    return;
  }
  const at = r.heatmap_positions;
  Plotly.react("positions-heatmap", [{
    type: "heatmap", z: r.heatmap, x: at, y: at, zmin: -1, zmax: 1, colorscale: "RdBu", reversescale: true,
    colorbar: { title: { text: "cos θ" } }, hovertemplate: "positions %{y} and %{x}<br>cos θ = %{z:.3f}<extra></extra>",
  }], { title: { text: `cosine similarity between the ${r.positions} position rows (${r.table})` +
    (at.length < r.positions ? `, every ${at[1] - at[0]}th` : ""), font: { size: 12 }, x: 0.01, xanchor: "left" },
    margin: { l: 50, r: 10, t: 36, b: 40 }, font: FONT, yaxis: { autorange: "reversed", title: { text: "position" }, scaleanchor: "x" },
    xaxis: { title: { text: "position" } } }, PLOT_CONFIG);
  const ks = r.by_distance.map((_, i) => i + 1);
  Plotly.react("positions-distance", [{
    type: "scatter", mode: "lines", x: ks, y: r.by_distance, line: { color: "#2563eb" },
    hovertemplate: "distance %{x}<br>mean cos θ = %{y:.4f}<extra></extra>",
  }], { title: { text: `mean similarity by distance (mean row norm ${fmt(r.norm_mean, 3)})`, font: { size: 12 }, x: 0.01, xanchor: "left" },
    margin: { l: 56, r: 10, t: 36, b: 40 }, font: FONT,
    xaxis: { type: "log", title: { text: "distance k (log scale)" } }, yaxis: { title: { text: "mean cos θ(t, t + k)" }, zeroline: true } }, PLOT_CONFIG);
});

// ---------------------------------------------------------------- 6. attention

let ATT = null;

function drawSmall(canvas, grid) {
  const n = grid.length, cell = Math.max(2, Math.floor(72 / n)), ctx = canvas.getContext("2d");
  canvas.width = canvas.height = n * cell;
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    if (j > i) ctx.fillStyle = "#f1f3f5";
    else { const w = grid[i][j]; ctx.fillStyle = `rgb(${Math.round(255 - 218 * w)},${Math.round(255 - 156 * w)},${Math.round(255 - 20 * w)})`; }
    ctx.fillRect(j * cell, i * cell, cell, cell);
  }
}

function attentionDetail(layer, head) {
  for (const f of document.querySelectorAll("#attention-grid figure")) {
    f.classList.toggle("selected", +f.dataset.layer === layer && +f.dataset.head === head);
  }
  const labels = ATT.pieces.map((p, t) => `${t}:${show(p)}`);
  const z = ATT.patterns[layer][head].map((row, i) => row.map((w, j) => (j <= i ? w : null)));
  Plotly.react("attention-detail", [{
    type: "heatmap", z, x: labels, y: labels, zmin: 0, zmax: 1, colorscale: "Blues", reversescale: true,
    hovertemplate: "query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>", colorbar: { title: { text: "weight" } },
  }], { title: { text: `layer ${layer + 1}, head ${head + 1}`, font: { size: 13 }, x: 0.01, xanchor: "left" }, font: FONT,
    margin: { l: 110, r: 10, t: 34, b: 110 }, xaxis: { tickangle: -60, title: { text: "key (attended to)" }, type: "category" },
    yaxis: { autorange: "reversed", title: { text: "query" }, type: "category" } }, PLOT_CONFIG);
}

DRAW.attention = () => run("attention", async () => {
  ATT = await api("/api/attention", { prompt: $("attention-prompt").value, bos: $("attention-bos").checked });
  const grid = $("attention-grid");
  grid.replaceChildren();
  for (let l = 0; l < ATT.layers; l++) {
    const row = el("div", { class: "row" }, el("span", { text: `layer ${l + 1}` }));
    for (let h = 0; h < ATT.heads; h++) {
      const canvas = el("canvas", { title: `layer ${l + 1}, head ${h + 1}` });
      drawSmall(canvas, ATT.patterns[l][h]);
      row.append(el("figure", { "data-layer": l, "data-head": h, onclick: () => attentionDetail(l, h) }, canvas,
        el("figcaption", { text: `head ${h + 1}` })));
    }
    grid.append(row);
  }
  attentionDetail(0, 0);
});

// ---------------------------------------------------------------- 7. logit lens

DRAW.lens = () => run("lens", async () => {
  const r = await api("/api/lens", { prompt: $("lens-prompt").value, k: intField("lens-k") });
  const table = $("lens-table");
  table.replaceChildren();
  const head = el("tr", {}, el("th", { text: "" }));
  r.pieces.forEach((p, t) => head.append(el("th", { title: `position ${t}, token ${r.ids[t]}`, text: `${t} ${show(p)}` })));
  table.append(el("thead", {}, head));
  const body = el("tbody");
  r.stages.forEach((stage, s) => {
    const tr = el("tr", {}, el("th", { text: stage }));
    r.lens[s].forEach((cell, t) => {
      const best = cell.top[0], next = t + 1 < r.ids.length ? r.ids[t + 1] : null;
      const lines = cell.top.map((x) => `${show(x.piece)}  ${pct(x.prob)}`);
      if (next !== null) lines.push(`next in the prompt, ${show(r.pieces[t + 1])}: ${pct(cell.next_prob)}`);
      const a = Math.min(1, best.prob);
      tr.append(el("td", { class: next !== null && best.id === next ? "hit" : "", title: `${stage}, position ${t}\n${lines.join("\n")}`,
        style: `background: rgba(37, 99, 235, ${(0.08 + 0.8 * a).toFixed(3)}); color: ${a > 0.45 ? "white" : "inherit"}` },
      show(best.piece), el("small", { text: pct(best.prob) })));
    });
    body.append(tr);
  });
  table.append(body);
});

// ---------------------------------------------------------------- 8. generate

let genAbort = null;

function tokenDetail(span, step) {
  for (const s of document.querySelectorAll(".gen-token.selected")) s.classList.remove("selected");
  span.classList.add("selected");
  const table = el("table");
  for (const alt of step.alternatives) {
    table.append(el("tr", { class: alt.id === step.id ? "chosen" : "" }, el("td", {}, piece(alt.piece)),
      el("td", { class: "p", text: pct(alt.prob) }), el("td", {}, el("span", { class: "bar", style: `width:${Math.round(160 * alt.prob)}px` }))));
  }
  const chosen = step.alternatives.some((a) => a.id === step.id) ? "" : ` (not among the top ${step.alternatives.length})`;
  $("gen-detail").replaceChildren(el("div", {}, "sampled ", piece(step.piece), ` with probability ${pct(step.prob)}${chosen}; the model's top choices:`), table);
}

function addToken(out, step) {
  const a = Math.sqrt(Math.max(0, Math.min(1, step.prob)));
  const span = el("span", { class: "gen-token", "data-prob": step.prob.toFixed(6), "data-id": step.id,
    title: `${show(step.piece)}: ${pct(step.prob)}\n` + step.alternatives.map((x) => `${show(x.piece)}  ${pct(x.prob)}`).join("\n"),
    style: `background: hsla(${Math.round(120 * a)}, 75%, 60%, 0.35)` }, step.text);
  span.addEventListener("mouseenter", () => tokenDetail(span, step));
  span.addEventListener("click", () => tokenDetail(span, step));
  out.append(span);
}

DRAW.generate = () => {};  // nothing to fetch until asked

function generate() {
  if (genAbort) genAbort.abort();
  const ctl = new AbortController();
  genAbort = ctl;
  $("gen-stop").disabled = false;
  $("gen-go").disabled = true;
  const out = $("gen-output");
  const prompt = $("gen-prompt").value;
  out.replaceChildren(el("span", { class: "prompt", text: prompt }));
  $("gen-detail").replaceChildren();
  $("gen-status").textContent = "generating…";
  let n = 0;
  return run("generate", async () => {
    try {
      const r = await fetch("/api/generate", { method: "POST", headers: { "Content-Type": "application/json" }, signal: ctl.signal,
        body: JSON.stringify({ prompt, max_new_tokens: intField("gen-max"), temperature: intField("gen-temp"),
          top_k: intField("gen-topk", { optional: true }), top_p: intField("gen-topp", { optional: true }),
          seed: intField("gen-seed", { optional: true }) }) });
      if (!r.ok) {
        let msg = `the server answered ${r.status}.`;
        try { msg = (await r.json()).error || msg; } catch (e) { /* not JSON */ }
        throw new Error(msg);
      }
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          if (!line) continue;
          const msg = JSON.parse(line);
          if (msg.error) throw new Error(msg.error);
          if (msg.done) $("gen-status").textContent = `${msg.tokens} tokens.`;
          else { addToken(out, msg); n++; $("gen-status").textContent = `${n} tokens…`; }
        }
      }
    } catch (e) {
      if (e.name === "AbortError") { $("gen-status").textContent = `stopped after ${n} tokens.`; return; }
      $("gen-status").textContent = "";
      throw e;
    } finally {
      if (genAbort === ctl) { genAbort = null; $("gen-stop").disabled = true; $("gen-go").disabled = false; }
    }
  });
}

// ---------------------------------------------------------------- 9. growth

const G = { info: null, seq: 0, timer: null, series: {}, map: null };
const TABLE_NAME = { input: "input table", output: "output head" };
const stepX = (s) => (s > 0 ? s : 0.5);  // a log axis has no 0: step 0 (the initialisation) is drawn at ½
const formText = (pieces) => (pieces.length === 1 ? show(pieces[0]) : `${pieces.map(show).join(" + ")} (mean of ${pieces.length} tokens)`);

function stepAxis() {
  // ticks at snapshot steps at least a tenth of the axis apart (log scale), the last step always
  const steps = G.info.steps, top = Math.log10(stepX(steps[steps.length - 1]) * 1.15), bottom = Math.log10(0.4);
  const gap = (top - bottom) / 10, shown = [];
  for (const s of steps) {
    if (!shown.length || Math.log10(stepX(s)) - Math.log10(stepX(shown[shown.length - 1])) >= gap) shown.push(s);
  }
  const last = steps[steps.length - 1];
  if (shown[shown.length - 1] !== last) {
    if (shown.length > 1 && Math.log10(stepX(last)) - Math.log10(stepX(shown[shown.length - 1])) < gap) shown.pop();
    shown.push(last);
  }
  return { type: "log", title: { text: "step (log scale; 0 is the initialisation)" }, tickvals: shown.map(stepX), tickangle: 0,
    ticktext: shown.map((s) => s.toLocaleString("en")), range: [bottom, top] };
}

function growthStep() { return G.info.steps[+$("growth-step").value]; }

function stepMarker() {
  return { type: "line", xref: "x", yref: "paper", x0: stepX(growthStep()), x1: stepX(growthStep()), y0: 0, y1: 1,
    line: { color: "#dc2626", width: 1.5, dash: "dot" } };
}

function markStep() {
  for (const id of ["growth-pairs", "growth-rho"]) {
    const node = $(id);
    if (node.layout) Plotly.relayout(node, { shapes: [...(node.dataset.base ? JSON.parse(node.dataset.base) : []), stepMarker()] });
  }
}

function drawPairs(r) {
  const colors = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];
  const xs = r.steps.map(stepX);
  const traces = Object.entries(r.series).map(([name, ys], i) => ({ type: "scatter", mode: "lines+markers", name, x: xs, y: ys,
    line: { color: colors[i % colors.length] }, customdata: r.steps, hovertemplate: `${name}<br>step %{customdata}: cos θ %{y:.3f}<extra></extra>` }));
  if (r.mean_cos.some((v) => v !== null)) {
    traces.push({ type: "scatter", mode: "lines", name: "the table's mean cos θ", x: xs, y: r.mean_cos, line: { color: "#64748b", dash: "dash" },
      customdata: r.steps, hovertemplate: "mean cos θ between rows<br>step %{customdata}: %{y:.3f}<extra></extra>" });
  }
  const base = [{ type: "rect", xref: "paper", yref: "y", x0: 0, x1: 1, y0: -r.band, y1: r.band, fillcolor: "#94a3b8", opacity: 0.18, line: { width: 0 }, layer: "below" }];
  $("growth-pairs").dataset.base = JSON.stringify(base);
  Plotly.react("growth-pairs", traces, { margin: { l: 56, r: 10, t: 10, b: 48 }, font: FONT, hovermode: "closest",
    legend: { orientation: "h", y: -0.25 }, xaxis: stepAxis(), yaxis: { title: { text: `cos θ (${r.centred ? "centred" : "raw"})` }, zeroline: true },
    shapes: [...base, stepMarker()] }, PLOT_CONFIG);
  const forms = Object.entries(r.forms).filter(([, p]) => p.length > 1).map(([w, p]) => `${w} = ${formText(p)}`);
  $("growth-pairs-note").textContent = `${TABLE_NAME[r.table]}; grey band: ±1/√d = ±${fmt(r.band, 3)}, the spread of cos θ between ` +
    `random rows like those at step 0, inside which "nearly orthogonal" means nothing more than chance.` + (forms.length ? ` ${forms.join("; ")}.` : "");
}

function drawRho(r) {
  const node = $("growth-rho");
  if (!r.fetched) {
    Plotly.purge(node);
    node.replaceChildren();
    node.style.minHeight = "0";
    node.style.height = "auto";
    $("growth-rho-note").textContent = r.note;
    return;
  }
  node.style.minHeight = node.style.height = "";
  const names = { simlex999: "SimLex-999", wordsim353: "WordSim-353" }, colors = { simlex999: "#2563eb", wordsim353: "#16a34a" };
  const xs = r.steps.map(stepX), traces = [], base = [];
  for (const [key, s] of Object.entries(r.sets)) {
    traces.push({ type: "scatter", mode: "lines+markers", name: `${names[key]} (n ${s.n})`, x: xs, y: s.rho, line: { color: colors[key] },
      customdata: r.steps, hovertemplate: `${names[key]}<br>step %{customdata}: ρ %{y:.3f}<extra></extra>` });
    if (s.null !== null) base.push({ type: "rect", xref: "paper", yref: "y", x0: 0, x1: 1, y0: -s.null, y1: s.null, fillcolor: colors[key], opacity: 0.1, line: { width: 0 }, layer: "below" });
  }
  node.dataset.base = JSON.stringify(base);
  Plotly.react(node, traces, { margin: { l: 56, r: 10, t: 10, b: 48 }, font: FONT, hovermode: "closest", legend: { orientation: "h", y: -0.25 },
    xaxis: stepAxis(), yaxis: { title: { text: `Spearman ρ (${r.centred ? "centred" : "raw"})` }, zeroline: true }, shapes: [...base, stepMarker()] }, PLOT_CONFIG);
  const nulls = Object.entries(r.sets).map(([k, s]) => `${names[k]} ±${fmt(s.null, 3)} over ${s.n} pairs`).join(", ");
  $("growth-rho-note").textContent = `${TABLE_NAME[r.table]}; shaded: the null spread 1/√(n − 1) of ρ for a table that knows nothing (${nulls}). ` +
    "Words of several tokens stand for the mean of their rows.";
}

function mapFrame(i) {
  const pts = G.map.frames[i];
  return { x: pts.map((p) => p[0]), y: pts.map((p) => p[1]) };
}

function drawMap(r) {
  G.map = r;
  const all = r.frames.flat(), pad = (lo, hi) => [lo - 0.08 * (hi - lo || 1), hi + 0.08 * (hi - lo || 1)];
  const xr = pad(Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0])));
  const yr = pad(Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1])));
  const single = r.words.map((w) => r.forms[w].length === 1);
  const i = +$("growth-step").value;
  Plotly.react("growth-map", [{ type: "scatter", mode: "markers+text", ...mapFrame(i), text: r.words, textposition: "top center",
    customdata: r.words.map((w) => formText(r.forms[w])), hovertemplate: "%{text}: %{customdata}<extra></extra>",
    marker: { size: 8, color: single.map((s) => (s ? "#2563eb" : "#ea580c")) } }],
  { margin: { l: 40, r: 10, t: 10, b: 36 }, font: FONT, hovermode: "closest", showlegend: false,
    xaxis: { range: xr, title: { text: `axis 1 (${(100 * r.explained[0]).toFixed(1)}% of the last step's variance)` }, zeroline: false },
    yaxis: { range: yr, title: { text: `axis 2 (${(100 * r.explained[1]).toFixed(1)}%)` }, zeroline: false } }, PLOT_CONFIG);
  $("growth-map").dataset.step = r.steps[i];
  const split = single.filter((s) => !s).length;
  $("growth-map-note").textContent = `${r.words.length} words, ${TABLE_NAME[r.table]}, centred. Each snapshot is rotated onto the last ` +
    "(orthogonal Procrustes, so the axes do not flip from step to step), scaled to its spread, and drawn on the last one's two " +
    "principal axes." +
    (split ? ` ${split} word${split > 1 ? "s are" : " is"} not one token (orange: the mean of its tokens' rows).` : "");
}

function moveMap() {
  if (!G.map) return;
  const i = +$("growth-step").value;
  const f = mapFrame(i);
  Plotly.animate("growth-map", { data: [{ x: f.x, y: f.y }], traces: [0] },
    { transition: { duration: 350, easing: "cubic-in-out" }, frame: { duration: 350, redraw: false } })
    .then(() => { $("growth-map").dataset.step = G.map.steps[i]; });
}

function drawNeighbours(r) {
  const list = $("growth-neighbours");
  list.replaceChildren();
  const top = Math.max(...r.neighbours.map((n) => Math.abs(n.score)), 1e-12);
  for (const n of r.neighbours) {
    const pick = el("button", { type: "button", title: `token ${n.id}: look it up`, onclick: () => {
      $("growth-word").value = n.piece.trim() || n.piece;
      growthRun(stepPanels);
    } }, piece(n.piece));
    list.append(el("li", { "data-id": n.id }, pick, el("span", { class: "score", text: n.score.toFixed(3) }),
      el("span", { class: "bar", style: `width:${Math.round(80 * Math.abs(n.score) / top)}px` })));
  }
  list.dataset.step = r.step;
  $("growth-word-note").textContent = `${r.word} → ${formText(r.form)} · ${TABLE_NAME[r.table]} at step ${r.step.toLocaleString("en")}, whole-word tokens`;
}

function drawUpdates(r) {
  const groups = [["seen", "seen in the batches", "#2563eb"], ["unseen", "in no batch", "#ea580c"]];
  const zero = r.rows.filter((x) => x.moved === 0).length;
  const traces = groups.map(([key, label, color]) => {
    const rows = r.rows.filter((x) => (key === "seen" ? x.seen > 0 : x.seen === 0));
    return { type: "scatter", mode: "markers", name: `${label} (${rows.length})`, x: rows.map((x) => x.seen), y: rows.map((x) => x.moved),
      text: rows.map((x) => show(x.piece)), marker: { size: 6, color, opacity: 0.6 },
      hovertemplate: "%{text}<br>in %{x} steps' batches, ‖Δ‖ = %{y:.3g}<extra></extra>" };
  });
  Plotly.react("growth-updates", traces, { margin: { l: 60, r: 10, t: 28, b: 44 }, font: FONT, hovermode: "closest",
    xaxis: { title: { text: `steps (of ${r.steps}) whose batch held the token` }, range: [-0.04 * r.steps - 0.3, 1.04 * r.steps + 0.3], zeroline: false },
    yaxis: { type: zero ? "linear" : "log", exponentformat: "power", dtick: zero ? undefined : "D2", title: { text: `‖Δ‖ of the row${zero ? "" : " (log scale)"}` } },
    legend: { orientation: "h", x: 0, y: 1.12 } }, PLOT_CONFIG);
  $("growth-updates").dataset.interval = `${r.start}-${r.end}`;
  $("growth-interval").textContent = `to step ${r.end.toLocaleString("en")} (${r.steps} step${r.steps > 1 ? "s" : ""}, ${TABLE_NAME[r.table]})`;
  $("growth-why").textContent = r.why;
  const say = (g, what) => (g.tokens ? `${g.tokens} tokens ${what}: mean ‖Δ‖ ${fmt(g.mean_moved, 5)}, ${pct(g.share_moved)} of them moved` : `no token ${what}`);
  $("growth-updates-summary").textContent = `${say(r.groups.seen, "seen")}; ${say(r.groups.unseen, "in no batch")}.` +
    (zero ? ` ${zero} row${zero > 1 ? "s" : ""} did not move at all (‖Δ‖ = 0).` : "");
}

// Every Growth request runs as a job: only the latest job draws and sets the view's state (ready or
// error), so answers that arrive out of order while the slider moves never overwrite newer ones.
async function growthRun(work) {
  const mine = ++G.seq, section = $("growth"), live = () => mine === G.seq;
  $("growth-error").textContent = "";
  section.dataset.state = "loading";
  try {
    await work(live);
    if (live()) section.dataset.state = "ready";
  } catch (e) {
    if (!live()) return;
    $("growth-error").textContent = e.message;
    section.dataset.state = "error";
  }
}

// The step-dependent panels (neighbours, sparse updates) for the slider's step.
async function stepPanels(live) {
  const steps = G.info.steps, i = +$("growth-step").value, table = $("growth-table").value;
  const end = i > 0 ? steps[i] : steps[1], start = Math.min(+$("growth-from").value, end - 1);
  const [nb, up] = await Promise.all([
    api("/api/growth/neighbours", { word: $("growth-word").value, step: steps[i], k: intField("growth-k"), table }),
    steps.length > 1 ? api("/api/growth/updates", { start, end, table }) : null,  // one snapshot: no interval yet
  ]);
  if (!live()) return;
  drawNeighbours(nb);
  if (up) drawUpdates(up);
  else $("growth-updates-summary").textContent = "The run has kept one snapshot so far: there is no interval to compare.";
  $("growth").dataset.step = steps[i];
}

const splitWords = (text) => text.split(/[,\n]+/).map((w) => w.trim()).filter(Boolean);

// The panels over all steps (pairs, ρ, the map), for the chosen table and words.
async function seriesPanels(live) {
  const table = $("growth-table").value, centred = $("growth-centred").checked;
  const pairs = $("growth-pairs-words").value.split(",").map((p) => p.trim().split(/\s+/).filter(Boolean)).filter((p) => p.length);
  const draw = (fn) => (r) => { if (live()) fn(r); };  // each panel as soon as its answer comes
  await Promise.all([
    api("/api/growth/pairs", { pairs, table, centred }).then(draw(drawPairs)),
    api("/api/growth/rho", { table, centred }).then(draw(drawRho)),
    api("/api/growth/map", { words: splitWords($("growth-map-words").value), table }).then(draw(drawMap)),
    (G.heads ? Promise.resolve(G.heads) : api("/api/growth/heads", {})).then(draw(drawHeads)),
  ]);
}

// Each head's score of the chosen kind at the steps the run scored them (andrea.inside.heads), beside the loss.
function drawHeads(r) {
  G.heads = r;
  const node = $("growth-heads"), kind = $("growth-heads-kind").value;
  if (!r.steps.length) {
    Plotly.purge(node);
    $("growth-heads-note").textContent = r.note;
    return;
  }
  const xs = r.steps.map(stepX), traces = [];
  const L = r.scores[kind][0].length, H = r.scores[kind][0][0].length;
  for (let l = 0; l < L; l++) for (let h = 0; h < H; h++) {
    traces.push({ type: "scatter", mode: "lines", name: `b${l + 1}h${h + 1}`, x: xs, y: r.scores[kind].map((s) => s[l][h]),
      customdata: r.steps, hovertemplate: `block ${l + 1} head ${h + 1}<br>step %{customdata}: %{y:.3f}<extra></extra>` });
  }
  const line = { type: "line", xref: "paper", x0: 0, x1: 1, y0: r.threshold, y1: r.threshold, line: { dash: "dot", color: "#b91c1c" } };
  Plotly.react(node, traces, { margin: { l: 56, r: 10, t: 10, b: 48 }, font: FONT, showlegend: L * H <= 16, legend: { orientation: "h", y: -0.25 },
    xaxis: stepAxis(), yaxis: { title: { text: `mean weight, ${kind}` }, range: [0, 1] }, shapes: [line] }, PLOT_CONFIG);
  $("growth-heads-note").textContent = `Each line a head, scored on BOS + r + r (random sequences r of ${r.n} tokens) at every snapshot; ` +
    `a kind is present above ${r.threshold} (dotted).`;
  const loss = r.loss;
  Plotly.react("growth-loss", [{ type: "scatter", mode: "lines", x: loss.steps.map(stepX), y: loss.smoothed, line: { color: "#2563eb" },
    hovertemplate: "step %{x}: %{y:.3f}<extra></extra>" }],
  { margin: { l: 56, r: 10, t: 10, b: 48 }, font: FONT, xaxis: stepAxis(), yaxis: { title: { text: "training loss (smoothed), nats" } } }, PLOT_CONFIG);
}

function fillFrom() {
  const steps = G.info.steps, i = +$("growth-step").value, choices = i > 0 ? steps.slice(0, i) : [steps[0]];
  $("growth-from").replaceChildren(...choices.map((s) => el("option", { value: s, text: s.toLocaleString("en") })));
  $("growth-from").value = String(choices[choices.length - 1]);
}

function labelStep() {
  const i = +$("growth-step").value, s = G.info.steps[i];
  $("growth-step-label").textContent = `step ${s.toLocaleString("en")}${s === 0 ? " (the initialisation)" : ""} · snapshot ${i + 1} of ${G.info.steps.length}`;
  fillFrom();
}

// The slider moves: the label, the marks on the curves and the map follow at once; the panels of
// the new step are asked for once the slider rests (150 ms).
function onSlide() {
  labelStep();
  markStep();
  moveMap();
  clearTimeout(G.timer);
  G.timer = setTimeout(() => growthRun(stepPanels), 150);
}

DRAW.growth = () => growthRun(async (live) => {
  const r = await api("/api/growth");
  if (!r.live) {
    $("growth-absent").textContent = r.note;
    $("growth-absent").hidden = false;
    return;
  }
  G.info = r;
  $("growth-live").hidden = false;
  $("growth-step").max = String(r.steps.length - 1);
  $("growth-step").value = String(r.steps.length - 1);
  $("growth-map-words").value = r.map_words.join(", ");
  $("growth-pairs-words").value = r.lesson_pairs.map((p) => p.join(" ")).join(", ");
  $("growth-suggestions").replaceChildren(...r.suggestions.map((w) => el("option", { value: w })));
  $("growth-run").textContent = `${r.run}: ${r.steps.length} snapshot${r.steps.length > 1 ? "s" : ""}, steps ${r.steps[0]} to ${r.steps[r.steps.length - 1].toLocaleString("en")}; ` +
    `V ${r.V.toLocaleString("en")}, d ${r.d}` + (r.rows < r.V ? `, ${r.rows.toLocaleString("en")} rows kept per snapshot` : "") +
    `; recipe ${r.recipe}.` + (r.wordsets.fetched ? "" : ` ${r.wordsets.note}`);
  labelStep();
  await Promise.all([seriesPanels(live), stepPanels(live)]);
});

function startGrowth() {
  const redraw = (series) => () => growthRun(async (live) => {
    await Promise.all([series ? seriesPanels(live) : null, stepPanels(live)]);
  });
  $("growth-step").addEventListener("input", onSlide);
  $("growth-from").addEventListener("change", redraw(false));
  $("growth-table").addEventListener("change", redraw(true));
  $("growth-centred").addEventListener("change", redraw(true));
  onSubmit("growth-word-form", redraw(false));
  onSubmit("growth-map-form", redraw(true));
  onSubmit("growth-pairs-form", redraw(true));
}

// ---------------------------------------------------------------- 10. word vectors from the blocks

const LAYER_NAMES = { input: "input table", output: "output head", ppmi: "PPMI" };
const SET_NAMES = { wordsim353: "WordSim-353", simlex999: "SimLex-999" };

DRAW.layers = () => run("layers", async () => {
  const r = await api("/api/layers", { uses: intField("layers-uses"), ppmi: $("layers-ppmi").checked });
  $("layers-note").textContent = `The hidden state after each block at a word's last token, the mean over up to ${r.uses} ` +
    `uses (windows of ${r.context} tokens), centred over the ${r.words.toLocaleString("en")} words with at least ` +
    `${r.min_uses} uses; a table's word is the mean of its token rows, the table centred.`;
  const head = el("tr", {}, el("th", { text: "set" }), el("th", { text: "pairs" }));
  const names = Object.keys(Object.values(r.sets)[0].scores);
  const label = (k) => LAYER_NAMES[k] || k;
  const order = ["input", ...names.filter((k) => k.startsWith("block")), ...names.filter((k) => k !== "input" && !k.startsWith("block"))];
  for (const k of order) head.append(el("th", { text: label(k) }));
  const rows = [head];
  for (const [set, part] of Object.entries(r.sets)) {
    const ys = order.map((k) => part.scores[k].rho), nulls = order.map((k) => part.scores[k].null);
    const band = Math.max(...nulls.filter(Number.isFinite), 0);
    Plotly.react(`layers-${set}`, [{
      type: "bar", x: order.map(label), y: ys, marker: { color: order.map((k) => (k.startsWith("block") ? "#2563eb" : "#9ca3af")) },
      hovertemplate: "%{x}<br>ρ = %{y:.3f}<extra></extra>",
    }], { title: PLOT_TITLE(`${SET_NAMES[set] || set}: ${part.pairs} of ${part.of} pairs (${part.with_several_tokens} with a word of several tokens)`),
      margin: { l: 50, r: 10, t: 36, b: 60 }, font: FONT, yaxis: { title: { text: "Spearman ρ" }, zeroline: true },
      shapes: [{ type: "rect", xref: "paper", x0: 0, x1: 1, y0: -band, y1: band, fillcolor: "#9ca3af", opacity: 0.25, line: { width: 0 } }],
    }, PLOT_CONFIG);
    const tr = el("tr", { "data-set": set }, el("th", { text: SET_NAMES[set] || set }), el("td", { text: String(part.pairs) }));
    for (const k of order) {
      const s = part.scores[k];
      tr.append(el("td", { text: Number.isFinite(s.rho) ? `${s.rho >= 0 ? "+" : ""}${fmt(s.rho, 3)} ± ${fmt(s.null, 3)}` : "—" }));
    }
    rows.push(tr);
  }
  $("layers-table").replaceChildren(...rows);
});

// ---------------------------------------------------------------- start

function onSubmit(id, fn) {
  $(id).addEventListener("submit", (ev) => { ev.preventDefault(); fn(); });
}

async function start() {
  for (const b of document.querySelectorAll("nav button")) b.addEventListener("click", () => select(b.dataset.view));
  onSubmit("token-form", DRAW.token);
  onSubmit("compare-form", DRAW.compare);
  onSubmit("map-form", DRAW.map);
  onSubmit("attention-form", DRAW.attention);
  onSubmit("lens-form", DRAW.lens);
  onSubmit("layers-form", DRAW.layers);
  onSubmit("gen-form", generate);
  $("compare-lesson").addEventListener("click", lesson);
  $("growth-heads-kind").addEventListener("change", () => { if (G.heads) drawHeads(G.heads); });
  for (const b of document.querySelectorAll(".walks button")) {
    b.addEventListener("click", () => { WALK = b.dataset.walk; DRAW.lesson(); });
  }
  $("gen-stop").addEventListener("click", () => genAbort && genAbort.abort());
  $("params-preset").addEventListener("change", DRAW.params);
  startGrowth();
  window.addEventListener("hashchange", () => select(location.hash.slice(1)));
  try {
    INFO = await api("/api/info");
    const c = INFO.config;
    $("model-name").textContent = INFO.model;
    $("model-summary").textContent = `${INFO.params.toLocaleString("en")} parameters · d ${c.n_embd} · ${c.n_head} heads · ` +
      `${c.n_layer} layers · context ${c.block_size} · V ${c.vocab_size.toLocaleString("en")} · positions ${c.pos}`;
    $("model-note").textContent = INFO.tokenizer_note || "";
    for (const p of INFO.presets) $("params-preset").append(el("option", { value: p, text: p }));
    $("suggestions").replaceChildren(...INFO.suggestions.map((w) => el("option", { value: w })));
  } catch (e) {
    $("model-name").textContent = `the lab server did not answer: ${e.message}`;
  }
  document.body.dataset.ready = "true";
  select(location.hash.slice(1) || "lesson");
}

start();
