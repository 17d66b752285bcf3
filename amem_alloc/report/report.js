// report.js — draws the amem report's plots as inline SVG from the JSON in #amem-data.
// No network, no libraries. Text from the trace is only ever set with textContent.
// Each drawn plot gets data-drawn="true" and data-paths / data-rects counts; <body> gets
// data-plots-drawn with the total, so a headless browser can check what was drawn.
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";  // the SVG namespace name, not a download
  var W = 960, H = 260, M = { l: 74, r: 16, t: 14, b: 30 };
  var COLORS = { allocated: "#2b6cb0", reserved: "#c05621", fragmentation: "#6b46c1" };
  var STATE_COLORS = ["#2b6cb0", "#dd6b20"];
  var BAND_COLORS = ["#2b6cb0", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795", "#d69e2e", "#3182ce",
                     "#9c4221", "#2c7a7b"];
  var KIND_COLORS = { before: "#a0aec0", other: "#e2e8f0" };
  var drawn = 0;

  function el(tag, attrs, parent) {
    var node = document.createElementNS(SVG, tag);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }
  function text(parent, x, y, s, anchor, cls) {
    var t = el("text", { x: x, y: y, "text-anchor": anchor || "start", "class": cls || "" }, parent);
    t.textContent = s;
    return t;
  }
  function fmtBytes(n) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? n.toFixed(0) : n.toFixed(n >= 100 ? 0 : n >= 10 ? 1 : 2)) + " " + units[i];
  }
  function fmtTime(t, unit) {
    if (unit === "event") return "#" + Math.round(t);
    if (t >= 1e6) return (t / 1e6).toFixed(t >= 1e7 ? 1 : 2) + " s";
    if (t >= 1e3) return (t / 1e3).toFixed(t >= 1e4 ? 0 : 1) + " ms";
    return t.toFixed(0) + " µs";
  }
  function fmtX(x, x0, unit) {  // a predicted run's x is the allocator call itself, not time since x0
    return unit === "call" ? "call " + Math.round(x) : fmtTime(x - x0, unit);
  }
  function fmtPct(v) { return (v * 100).toFixed(v < 0.1 ? 1 : 0) + "%"; }
  function niceStep(span, count) {
    var raw = span / Math.max(1, count), mag = Math.pow(10, Math.floor(Math.log10(raw || 1)));
    var steps = [1, 2, 5, 10], i = 0;
    while (i < steps.length - 1 && steps[i] * mag < raw) i++;
    return steps[i] * mag;
  }
  function byteStep(max) {  // ticks at powers of two times 1, 2 or 5
    var step = niceStep(max, 5), p = Math.pow(2, Math.round(Math.log2(step || 1)));
    return Math.max(1, p);
  }

  // A step-line chart: xs, one or more series of ys; markers are vertical lines (OOMs, peak).
  function lineChart(host, xs, series, opt) {
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img" }, host);
    var x0 = xs[0], x1 = xs[xs.length - 1];
    if (!(x1 > x0)) { x1 = x0 + 1; }
    x1 += (x1 - x0) * 0.03;  // room on the right, so a marker at the last point is not hidden by the lines
    var ymax = opt.ymax || 0;
    series.forEach(function (s) { s.ys.forEach(function (v) { if (v > ymax) ymax = v; }); });
    if (!(ymax > 0)) ymax = 1;
    var sx = function (x) { return M.l + (x - x0) / (x1 - x0) * (W - M.l - M.r); };
    var sy = function (y) { return H - M.b - y / ymax * (H - M.t - M.b); };
    var axis = el("g", { "class": "axis" }, svg);
    var ystep = opt.percent ? 0.2 : byteStep(ymax);
    for (var y = 0; y <= ymax * 1.0001; y += ystep) {
      el("line", { x1: M.l, x2: W - M.r, y1: sy(y), y2: sy(y) }, axis);
      text(axis, M.l - 6, sy(y) + 4, opt.percent ? fmtPct(y) : fmtBytes(y), "end");
    }
    var xstep = niceStep(x1 - x0, 8);
    for (var x = Math.ceil(x0 / xstep) * xstep; x <= x1; x += xstep) {
      text(axis, sx(x), H - 10, fmtX(x, x0, opt.unit), "middle");
    }
    el("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, stroke: "#a0aec0" }, svg);
    el("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, stroke: "#a0aec0" }, svg);
    drawPhases(svg, opt.phases || [], sx);  // under the lines
    var paths = 0;
    series.forEach(function (s) {
      var d = "M" + sx(xs[0]).toFixed(1) + " " + sy(s.ys[0]).toFixed(1);
      for (var i = 1; i < xs.length; i++) {
        d += "H" + sx(xs[i]).toFixed(1) + "V" + sy(s.ys[i]).toFixed(1);
      }
      if (xs.length === 1) d += "H" + sx(x1).toFixed(1);
      el("path", { d: d, fill: "none", stroke: s.color, "stroke-width": 1.6, "class": "plot-line",
                   "data-series": s.name, "data-points": xs.length }, svg);
      paths++;
    });
    drawMarkers(svg, opt.markers || [], sx);
    addReadout(host, svg, xs, series, sx, opt);
    host.setAttribute("data-paths", paths);
    host.setAttribute("data-drawn", "true");
    drawn++;
  }

  // Vertical markers, drawn over the lines; an out-of-memory marker also gets a label at the top.
  function drawMarkers(svg, markers, sx) {
    markers.forEach(function (m) {
      var g = el("g", { "class": m.cls }, svg);
      var x = sx(m.x).toFixed(1);
      el("line", { x1: x, x2: x, y1: M.t, y2: H - M.b, stroke: m.color, "stroke-width": m.width || 1.5,
                   "stroke-dasharray": m.dash || "" }, g);
      if (m.tag) {
        el("path", { d: "M" + x + " " + (M.t + 7) + "l-5 -7h10z", fill: m.color }, g);
        var t = text(g, Number(x) - 7, M.t + 8, m.tag, "end", "marker-label");
        t.setAttribute("fill", m.color);
      }
      el("title", {}, g).textContent = m.label;
    });
  }

  // A predicted run's phases ([first call, last call, name, colour]): a strip under the plot area
  // and a light tint over it, each titled with its name and calls.
  function drawPhases(svg, phases, sx) {
    if (!phases.length) return;
    var g = el("g", { "class": "phases" }, svg);
    phases.forEach(function (p) {
      var x = Math.max(M.l, sx(p[0] - 1)), w = Math.max(0.5, sx(p[1]) - x);
      el("rect", { x: x.toFixed(1), y: M.t, width: w.toFixed(1), height: H - M.t - M.b, fill: p[3],
                   "fill-opacity": 0.07 }, g);
      var strip = el("rect", { x: x.toFixed(1), y: H - M.b + 1, width: w.toFixed(1), height: 6, fill: p[3],
                               "class": "phase", "data-phase": p[2] }, g);
      el("title", {}, strip).textContent = p[2] + ": allocator calls " + p[0] + "–" + p[1];
    });
  }

  // A stacked area chart: bands of ys over xs, drawn bottom-up; the legend names each band.
  function stackedChart(host, legend, xs, bands, opt) {
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img" }, host);
    var x0 = xs[0], x1 = xs[xs.length - 1];
    if (!(x1 > x0)) { x1 = x0 + 1; }
    x1 += (x1 - x0) * 0.03;
    var tops = [], base = xs.map(function () { return 0; }), ymax = 1;
    bands.forEach(function (b) {
      var top = base.map(function (v, i) { return v + b.values[i]; });
      tops.push({ band: b, lo: base, hi: top });
      top.forEach(function (v) { if (v > ymax) ymax = v; });
      base = top;
    });
    var sx = function (x) { return M.l + (x - x0) / (x1 - x0) * (W - M.l - M.r); };
    var sy = function (y) { return H - M.b - y / ymax * (H - M.t - M.b); };
    var axis = el("g", { "class": "axis" }, svg), ystep = byteStep(ymax);
    for (var y = 0; y <= ymax * 1.0001; y += ystep) {
      el("line", { x1: M.l, x2: W - M.r, y1: sy(y), y2: sy(y) }, axis);
      text(axis, M.l - 6, sy(y) + 4, fmtBytes(y), "end");
    }
    var xstep = niceStep(x1 - x0, 8);
    for (var x = Math.ceil(x0 / xstep) * xstep; x <= x1; x += xstep) {
      text(axis, sx(x), H - 10, fmtX(x, x0, opt.unit), "middle");
    }
    drawPhases(svg, opt.phases || [], sx);  // under the bands
    var areas = 0;
    var sitesSeen = 0;
    tops.forEach(function (s) {
      var color = KIND_COLORS[s.band.kind] || BAND_COLORS[sitesSeen++ % BAND_COLORS.length], d = "M" + sx(xs[0]).toFixed(1) + " " + sy(s.hi[0]).toFixed(1);
      for (var i = 1; i < xs.length; i++) d += "H" + sx(xs[i]).toFixed(1) + "V" + sy(s.hi[i]).toFixed(1);
      d += "H" + sx(x1).toFixed(1) + "V" + sy(s.lo[xs.length - 1]).toFixed(1);
      for (var j = xs.length - 1; j > 0; j--) d += "H" + sx(xs[j]).toFixed(1) + "V" + sy(s.lo[j - 1]).toFixed(1);
      d += "H" + sx(xs[0]).toFixed(1) + "Z";
      var p = el("path", { d: d, fill: color, "fill-opacity": 0.85, stroke: "none", "class": "band",
                           "data-band": s.band.name }, svg);
      el("title", {}, p).textContent = s.band.name;
      var item = document.createElement("span");
      item.className = "band-name";
      var swatch = document.createElement("i");
      swatch.style.background = color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(s.band.name));
      legend.appendChild(item);
      areas++;
    });
    el("line", { x1: M.l, x2: M.l, y1: M.t, y2: H - M.b, stroke: "#a0aec0" }, svg);
    el("line", { x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b, stroke: "#a0aec0" }, svg);
    drawMarkers(svg, opt.markers || [], sx);
    addReadout(host, svg, xs, tops.map(function (s) { return { name: s.band.name, ys: s.band.values }; }).reverse(),
               sx, opt);
    host.setAttribute("data-bands", areas);
    host.setAttribute("data-drawn", "true");
    drawn++;
  }

  function addReadout(host, svg, xs, series, sx, opt) {
    var box = document.createElement("div");
    box.className = "readout";
    host.appendChild(box);
    var cursor = el("line", { y1: M.t, y2: H - M.b, stroke: "#718096", visibility: "hidden" }, svg);
    svg.addEventListener("mousemove", function (ev) {
      var r = svg.getBoundingClientRect(), px = (ev.clientX - r.left) / r.width * W;
      var lo = 0, hi = xs.length - 1;
      while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (sx(xs[mid]) <= px) lo = mid; else hi = mid - 1; }
      cursor.setAttribute("x1", sx(xs[lo])); cursor.setAttribute("x2", sx(xs[lo]));
      cursor.setAttribute("visibility", "visible");
      box.textContent = fmtX(xs[lo], xs[0], opt.unit) + ": " + series.map(function (s) {
        return s.name + " " + (opt.percent ? fmtPct(s.ys[lo]) : fmtBytes(s.ys[lo]));
      }).join(", ");
    });
  }

  // The segment map: one row per segment (scaled to its own size), blocks coloured by state.
  function segmentMap(host, map) {
    var rowH = 11, gap = 3, labelW = 190, barW = W - labelW - M.r;
    var rows = map.rows, height = Math.max(1, rows.length) * (rowH + gap) + 4;
    var svg = el("svg", { viewBox: "0 0 " + W + " " + height, role: "img" }, host);
    var rects = 0, segments = 0;
    rows.forEach(function (row, i) {
      var y = 2 + i * (rowH + gap);
      var label = (row.aggregate ? row.count + " × " + (row.smallest === row.largest ? fmtBytes(row.largest) :
                   fmtBytes(row.smallest) + "–" + fmtBytes(row.largest)) : fmtBytes(row.size)) +
                  (row.stream ? " s" + row.stream : "") + (row.expandable ? " exp" : "");
      text(svg, labelW - 8, y + rowH - 2, label, "end", "seglabel");
      var bg = el("rect", { x: labelW, y: y, width: barW, height: rowH, fill: "#e2e8f0", "class": "segment" }, svg);
      el("title", {}, bg).textContent = (row.aggregate ? row.count + " segments, " : "segment " + row.address + ", ") +
        fmtBytes(row.size) + ", stream " + row.stream + ", " + fmtBytes(row.allocated) + " allocated";
      if (row.aggregate) {  // the group's bytes by state: allocated, pending free, then free
        var wa = row.allocated / row.size * barW, wp = row.pending / row.size * barW;
        [[0, wa, 0], [wa, wp, 1]].forEach(function (part) {
          if (part[1] <= 0) return;
          var r = el("rect", { x: (labelW + part[0]).toFixed(2), y: y, width: part[1].toFixed(2), height: rowH,
                               fill: STATE_COLORS[part[2]], "class": "aggregate" }, svg);
          el("title", {}, r).textContent = row.count + " segments: " + fmtBytes(row.allocated) + " allocated, " +
            fmtBytes(row.pending) + " pending free, of " + fmtBytes(row.size);
        });
        segments += row.count;
        return;
      }
      segments += 1;
      row.blocks.forEach(function (b) {
        var x = labelW + b[0] / row.size * barW, w = Math.max(0.6, b[1] / row.size * barW);
        var r = el("rect", { x: x.toFixed(2), y: y, width: Math.min(w, labelW + barW - x).toFixed(2),
                             height: rowH, fill: STATE_COLORS[b[2]] || STATE_COLORS[0], "class": "block" }, svg);
        el("title", {}, r).textContent = b[3];
        rects++;
      });
    });
    host.setAttribute("data-rects", rects);
    host.setAttribute("data-rows", rows.length);
    host.setAttribute("data-segments", segments);
    host.setAttribute("data-drawn", "true");
    drawn++;
  }

  function drawDevice(dev) {
    var s = dev.series, id = dev.device;
    var markers = dev.ooms.map(function (o) {
      return { x: o.t, color: "#e53e3e", cls: "oom-marker", width: 2.5, tag: "OOM " + fmtBytes(o.size),
               label: "out of memory: " + fmtBytes(o.size) + " requested, " + fmtBytes(o.free) + " free" };
    });
    var steps = dev.steps || [];
    steps.forEach(function (call, k) {
      markers.push({ x: call, color: "#718096", dash: "2 3", width: 1, cls: "step-marker",
                     label: "optimizer step " + (k + 1) + " ends after allocator call " + call });
    });
    markers.unshift({ x: dev.peak.t, color: "#2f855a", dash: "4 3", cls: "peak-marker",
                      label: "peak allocated: " + fmtBytes(dev.peak.allocated) +
                             (dev.time_unit === "call" ? ", after allocator call " + Math.round(dev.peak.t) : "") });
    var t = document.getElementById("timeline-" + id);
    if (t) lineChart(t, s.t, [{ name: "allocated", ys: s.allocated, color: COLORS.allocated },
                              { name: "reserved", ys: s.reserved, color: COLORS.reserved }],
                     { unit: dev.time_unit, markers: markers, phases: dev.phases });
    var st = document.getElementById("stacked-" + id), lg = document.getElementById("stacked-legend-" + id);
    if (st && lg && dev.stacked.bands.length) stackedChart(st, lg, s.t, dev.stacked.bands,
                                                          { unit: dev.time_unit, markers: markers, phases: dev.phases });
    var sc = document.getElementById("stacked-cat-" + id), lc = document.getElementById("stacked-cat-legend-" + id);
    if (sc && lc && dev.stacked_categories && dev.stacked_categories.bands.length)
      stackedChart(sc, lc, s.t, dev.stacked_categories.bands,
                   { unit: dev.time_unit, markers: markers, phases: dev.phases });
    var f = document.getElementById("fragmentation-" + id);
    if (f) lineChart(f, s.t, [{ name: "fragmentation", ys: s.fragmentation, color: COLORS.fragmentation }],
                     { unit: dev.time_unit, percent: true, ymax: 1, markers: markers, phases: dev.phases });
    var m = document.getElementById("segmap-" + id);
    if (m) segmentMap(m, dev.segmap);
  }

  try {
    var data = JSON.parse(document.getElementById("amem-data").textContent);
    data.devices.forEach(drawDevice);
    document.body.setAttribute("data-plots-drawn", drawn);
  } catch (err) {
    var box = document.getElementById("amem-error");
    box.hidden = false;
    box.textContent = "The report's script failed: " + err;
    document.body.setAttribute("data-error", String(err));
  }
})();
