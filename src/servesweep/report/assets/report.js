// servesweep HTML report: draws the charts (Apache ECharts, inlined before this
// script) from the page's JSON data, explains a hovered point by its trial, sorts
// tables, and reloads the page while a watched sweep runs. No network, no eval: every
// text from the data is put into the page as text (textContent), never as HTML.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var trials = data.trials || {};

  // -- hover explanations, built as DOM nodes ------------------------------------
  function line(text, cls) {
    var div = document.createElement("div");
    if (cls) div.className = cls;
    div.textContent = text;
    return div;
  }
  function trialLines(id, level) {
    var t = trials[String(id)];
    if (!t) return [];
    var out = [], head = document.createElement("b");
    head.textContent = t.label;
    out.push(head);
    out.push(line("outcome: " + t.outcome, "k"));
    if (t.where) out.push(line("ran on: " + t.where, "k"));
    t.params.forEach(function (kv) { out.push(line(kv[0] + " = " + kv[1])); });
    if (t.failure) out.push(line(t.failure, "k"));
    var metrics = level && t.levels[level];
    if (metrics && metrics.length) {
      out.push(line(level + ":", "k"));
      metrics.forEach(function (kv) { out.push(line("  " + kv[0] + " = " + kv[1])); });
    }
    return out;
  }
  function box(nodes) {
    var div = document.createElement("div");
    div.className = "tip";
    nodes.forEach(function (n) { div.appendChild(n); });
    return div;
  }
  function itemLines(item) {
    return (item && item.lines ? item.lines : []).map(function (t) { return line(t); });
  }
  var tooltips = {
    point: function (p) {
      var item = p.data || {};
      var nodes = itemLines(item);
      if (item.trial !== undefined) nodes = nodes.concat(trialLines(item.trial, item.level));
      return box(nodes.length ? nodes : [line(p.seriesName)]);
    },
    item: function (p) {
      var item = p.data || {};
      var nodes = itemLines(item);
      if (item.trial !== undefined && nodes.length === 0) nodes = trialLines(item.trial);
      return box(nodes.length ? nodes : [line(p.seriesName)]);
    },
    axis: function (ps) {
      var nodes = [];
      (Array.isArray(ps) ? ps : [ps]).forEach(function (p) {
        var item = p.data || {};
        nodes.push(line(item.lines && item.lines.length ? item.lines[0] : p.seriesName));
      });
      var first = (Array.isArray(ps) ? ps[0] : ps) || {};
      if (first.data && first.data.lines && first.data.lines[1]) nodes.push(line(first.data.lines[1], "k"));
      return box(nodes);
    }
  };
  tooltips.cell = tooltips.point;

  // -- chart options -------------------------------------------------------------
  function laneBar(params, api) {
    var lane = api.value(0);
    var a = api.coord([api.value(1), lane]);
    var b = api.coord([api.value(2), lane]);
    var h = api.size([0, 1])[1] * 0.6;
    var shape = echarts.graphic.clipRectByRect(
      { x: a[0], y: a[1] - h / 2, width: Math.max(b[0] - a[0], 1), height: h },
      { x: params.coordSys.x, y: params.coordSys.y,
        width: params.coordSys.width, height: params.coordSys.height });
    return shape && { type: "rect", shape: shape, style: api.style() };
  }
  function errorBar(params, api) {
    var x = api.value(0);
    var lo = api.coord([x, api.value(1)]);
    var hi = api.coord([x, api.value(2)]);
    var cap = 5;
    var style = { stroke: api.visual("color"), lineWidth: 1.5 };
    return { type: "group", children: [
      { type: "line", shape: { x1: lo[0], y1: lo[1], x2: hi[0], y2: hi[1] }, style: style },
      { type: "line", shape: { x1: lo[0] - cap, y1: lo[1], x2: lo[0] + cap, y2: lo[1] }, style: style },
      { type: "line", shape: { x1: hi[0] - cap, y1: hi[1], x2: hi[0] + cap, y2: hi[1] }, style: style }
    ] };
  }
  function fromData(p) { return (p.data && p.data.text) || ""; }
  function decorate(spec) {
    var option = spec.option;
    option.animation = false;
    option.tooltip = Object.assign({ confine: true, enterable: false },
      option.tooltip || {},
      { trigger: spec.tooltip === "axis" ? "axis" : "item", formatter: tooltips[spec.tooltip] });
    if (option.xAxis && !option.parallelAxis) {
      option.toolbox = { right: 10, feature: { dataZoom: { filterMode: "none" }, restore: {} } };
    }
    (option.series || []).forEach(function (s) {
      if (s.label && s.label.fromData) {
        delete s.label.fromData;
        s.label.formatter = fromData;
      }
      if (s.renderItem === "lane-bar") s.renderItem = laneBar;
      if (s.renderItem === "error-bar") s.renderItem = errorBar;
      if (s.type === "scatter") s.itemStyle = Object.assign({ opacity: 1 }, s.itemStyle || {});
    });
    return option;
  }

  var charts = {};
  var drawn = 0;
  (data.charts || []).forEach(function (spec) {
    var el = document.getElementById(spec.id);
    if (!el) return;
    el.style.height = spec.height + "px";
    var chart = echarts.init(el, null, { renderer: "svg" });
    chart.on("finished", function () {
      if (!el.hasAttribute("data-drawn")) { el.setAttribute("data-drawn", "1"); drawn += 1; }
      document.documentElement.setAttribute("data-charts-drawn", String(drawn));
    });
    chart.setOption(decorate(spec));
    charts[spec.id] = chart;
  });
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (k) { charts[k].resize(); });
  });

  // -- sortable tables -----------------------------------------------------------
  function cellValue(row, col) {
    var cell = row.cells[col];
    if (!cell) return { num: NaN, text: "" };
    var raw = cell.getAttribute("data-v");
    var num = raw === null || raw === "" ? NaN : parseFloat(raw);
    return { num: num, text: cell.textContent || "" };
  }
  function sortTable(table, col, descending) {
    var body = table.tBodies[0];
    if (!body) return;
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, col), y = cellValue(b, col);
      var cmp;
      if (isNaN(x.num) && isNaN(y.num)) cmp = x.text.localeCompare(y.text);
      else if (isNaN(x.num)) return 1; // missing values last, whatever the order
      else if (isNaN(y.num)) return -1;
      else cmp = x.num - y.num;
      return descending ? -cmp : cmp;
    });
    rows.forEach(function (r) { body.appendChild(r); });
    var heads = table.tHead ? table.tHead.rows[0].cells : [];
    for (var i = 0; i < heads.length; i++) {
      heads[i].setAttribute("aria-sort", i === col ? (descending ? "descending" : "ascending") : "none");
    }
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    if (!table.tHead) return;
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.tabIndex = 0;
      var handler = function () {
        sortTable(table, col, th.getAttribute("aria-sort") === "ascending");
      };
      th.addEventListener("click", handler);
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); handler(); }
      });
    });
  });
  // #sort=COLUMN or #sort=COLUMN-desc sorts the results table on load (shareable links).
  var match = /^#sort=(\d+)(-desc)?$/.exec(window.location.hash);
  var results = document.getElementById("results");
  if (match && results) sortTable(results, parseInt(match[1], 10), !!match[2]);

  // -- a watched sweep: reload while it runs, keeping the scroll position ---------
  var key = "servesweep-scroll:" + window.location.pathname;
  try {
    var saved = window.sessionStorage.getItem(key);
    if (saved !== null) { window.scrollTo(0, parseFloat(saved)); window.sessionStorage.removeItem(key); }
  } catch (e) { /* storage refused (a sandboxed file view): reloads start at the top */ }
  if (data.reload_s) {
    window.setTimeout(function () {
      try { window.sessionStorage.setItem(key, String(window.scrollY)); } catch (e) { /* see above */ }
      window.location.reload();
    }, data.reload_s * 1000);
  }
  document.documentElement.setAttribute("data-charts", String(Object.keys(charts).length));
  document.documentElement.setAttribute("data-js", "ok");
})();
