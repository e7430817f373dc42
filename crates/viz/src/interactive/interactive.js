// hyperlens interactive figures (crates/viz/src/interactive): the latent-space explorer, the
// attention pattern viewer and the heatmap (the last two share the cell grid). Hand-written, no
// dependency, no network. Each figure is an SVG element of class hl-fig holding its data in a
// JSON script element of class hl-data; this script (included once per figure) defines
// window.hlViz once and boots every figure of the document that is not booted yet.
(function () {
  'use strict';
  if (typeof window === 'undefined' || typeof document === 'undefined') return;
  var NS = 'http://www.w3.org/2000/svg';
  var hl = window.hlViz;
  if (!hl) {
    hl = window.hlViz = {};

    var el = function (parent, tag, attrs, text) {
      var e = document.createElementNS(NS, tag);
      if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
      if (text !== undefined) e.textContent = text;
      if (parent) parent.appendChild(e);
      return e;
    };
    var clear = function (g) { while (g.firstChild) g.removeChild(g.firstChild); };
    // The binary array format, the decoder of `encode::array` (crates/viz/src/interactive/encode.rs,
    // `ArrayType`, which defines it): {t, n, b}, b the base64 of n little-endian values of type t;
    // u4 packs two values 0..=15 per byte, the low nibble first. Returns a typed array of n values.
    var ARRAY_TYPES = { u4: [Uint8Array, 0], u8: [Uint8Array, 1], u16: [Uint16Array, 2], i32: [Int32Array, 4], f32: [Float32Array, 4] };
    var dec = function (a) {
      var type = ARRAY_TYPES.hasOwnProperty(a.t) ? ARRAY_TYPES[a.t] : null;
      if (!type) throw new Error('hyperlens figure: unknown array type ' + a.t);
      var s = atob(a.b), bytes = type[1] ? a.n * type[1] : (a.n + 1) >> 1;
      if (s.length !== bytes) throw new Error('hyperlens figure: a ' + a.t + ' array of ' + a.n + ' values has ' + s.length + ' bytes, not ' + bytes);
      var u = new Uint8Array(s.length);
      for (var i = 0; i < s.length; i++) u[i] = s.charCodeAt(i);
      if (!type[1]) {
        var o = new Uint8Array(a.n);
        for (var j = 0; j < a.n; j++) o[j] = (u[j >> 1] >> ((j & 1) * 4)) & 15;
        return o;
      }
      if (type[1] === 1) return u;
      var out = new type[0](a.n), view = new DataView(u.buffer);
      var read = a.t === 'u16' ? 'getUint16' : a.t === 'i32' ? 'getInt32' : 'getFloat32';
      for (var k = 0; k < a.n; k++) out[k] = view[read](k * type[1], true);
      return out;
    };
    hl.decodeArray = dec;
    var fmt = function (v) {
      if (v === 0) return '0';
      var a = Math.abs(v);
      return a >= 1000 || a < 0.001 ? v.toExponential(2) : String(Number(v.toPrecision(4)));
    };
    // Pointer position in the figure's own coordinates (the SVG may be scaled by its page).
    var local = function (svg, ev) {
      var m = svg.getScreenCTM();
      if (!m) return { x: 0, y: 0 };
      var p = svg.createSVGPoint();
      p.x = ev.clientX; p.y = ev.clientY;
      p = p.matrixTransform(m.inverse());
      return { x: p.x, y: p.y };
    };
    var button = function (parent, x, y, label, on, click) {
      var w = 10 + 7 * label.length;
      var g = el(parent, 'g', { class: 'hl-btn' + (on ? ' on' : ''), transform: 'translate(' + x + ',' + y + ')' });
      el(g, 'rect', { width: w, height: 20, rx: 3 });
      el(g, 'text', { x: w / 2, y: 14, 'text-anchor': 'middle' }, label);
      g.addEventListener('click', click);
      return w;
    };
    // A row of buttons "name: a b c"; returns the x after it.
    var switcher = function (parent, x, y, name, labels, current, pick) {
      el(parent, 'text', { x: x, y: y + 14, class: 'hl-small' }, name + ':');
      x += 8 + 6.5 * name.length;
      labels.forEach(function (label, k) {
        x += button(parent, x, y, label, k === current, function () { pick(k); }) + 4;
      });
      return x + 12;
    };
    var tooltip = function (svg) {
      var g = el(svg, 'g', { class: 'hl-tip', 'pointer-events': 'none', display: 'none' });
      return {
        show: function (x, y, lines) {
          clear(g);
          var w = 20 + 6.6 * Math.max.apply(null, lines.map(function (s) { return s.length; }));
          var h = 8 + 15 * lines.length;
          var W = +svg.getAttribute('width'), H = +svg.getAttribute('height');
          var tx = x + 14 + w > W ? x - 14 - w : x + 14, ty = Math.min(Math.max(y - h / 2, 2), H - h - 2);
          el(g, 'rect', { x: tx, y: ty, width: w, height: h, rx: 4 });
          lines.forEach(function (s, i) {
            el(g, 'text', { x: tx + 8, y: ty + 17 + 15 * i, class: i === 0 ? 'hl-tip-head' : 'hl-tip-line', 'font-weight': i === 0 ? 'bold' : 'normal' }, s);
          });
          g.setAttribute('display', 'inline');
          svg.appendChild(g);
        },
        hide: function () { g.setAttribute('display', 'none'); }
      };
    };
    // Colour of t in [0, 1]: white to dark blue; or blue-white-red when the range crosses zero.
    var ramp = function (v, r) {
      var mix = function (a, b, t) {
        return 'rgb(' + [0, 1, 2].map(function (i) { return Math.round(a[i] + (b[i] - a[i]) * t); }).join(',') + ')';
      };
      if (r[0] < 0 && r[1] > 0) {
        var m = Math.max(-r[0], r[1]), t = Math.max(-1, Math.min(1, v / m));
        return t < 0 ? mix([247, 247, 247], [33, 102, 172], -t) : mix([247, 247, 247], [178, 24, 43], t);
      }
      var s = (v - r[0]) / (r[1] - r[0] || 1);
      return mix([247, 251, 255], [8, 48, 107], Math.max(0, Math.min(1, s)));
    };
    var nice = function (lo, hi, n) {
      var span = hi - lo, step = Math.pow(10, Math.floor(Math.log10(span / n)));
      [1, 2, 5, 10].some(function (m) { if (span / (step * m) <= n) { step *= m; return true; } return false; });
      var out = [];
      for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
      return out;
    };

    // ---- the latent-space explorer ------------------------------------------------------
    // One explorer is a context object E (made by explorerContext) that the steps below share:
    // the data D, the decoded sets, the state st, the SVG groups g and the points' circles.
    var PX = 64, PY = 76, PS = 440; // the plot frame
    var DETAIL_X = 700; // the left edge of the clicked point's detail

    // The sets of D with their binary arrays decoded.
    var decodeSets = function (D) {
      return D.sets.map(function (s) {
        return {
          raw: s,
          n: s.n,
          index: dec(s.index),
          colors: s.colors.map(dec),
          fields: s.fields.map(function (f) { return { name: f.name, kind: f.kind, names: f.names, v: f.kind === 'text' ? f.v : dec(f.v) }; }),
          xy: s.xy.map(function (byLayer) { return byLayer.map(function (a) { return { x: dec(a.x), y: dec(a.y), rx: a.rx, ry: a.ry }; }); }),
          codes: s.codes ? s.codes.map(function (c) { return { q: dec(c.q), r: c.r, top: c.top }; }) : null,
          problems: s.problems ? { values: dec(s.problems.values), F: s.problems.features, slot: dec(s.problems.slot), prediction: dec(s.problems.prediction), marked: s.problems.marked, query: s.problems.query } : null
        };
      });
    };
    // The explorer's context: its data, state and the SVG groups in drawing order.
    var explorerContext = function (svg, D) {
      var sets = decodeSets(D);
      var E = {
        svg: svg, D: D, sets: sets, W: +svg.getAttribute('width'), circles: [], tip: tooltip(svg),
        st: { set: sets.length - 1, layer: D.start, proj: 0, color: 0, sel: -1, view: null, hidden: D.colorings.map(function () { return {}; }) }
      };
      el(svg, 'text', { x: 12, y: 22, class: 'hl-title' }, D.title);
      var g = E.g = {};
      g.controls = el(svg, 'g', { class: 'hl-controls' });
      var clip = el(el(svg, 'defs'), 'clipPath', { id: svg.id + '-clip' });
      el(clip, 'rect', { x: PX, y: PY, width: PS, height: PS });
      g.axes = el(svg, 'g', { class: 'hl-axes' });
      g.bg = el(svg, 'rect', { x: PX, y: PY, width: PS, height: PS, fill: '#fff', class: 'hl-plot', cursor: 'move' });
      g.pts = el(svg, 'g', { class: 'hl-points', 'clip-path': 'url(#' + svg.id + '-clip)' });
      el(svg, 'rect', { x: PX, y: PY, width: PS, height: PS, class: 'hl-frame' });
      g.legend = el(svg, 'g', { class: 'hl-legend' });
      g.detail = el(svg, 'g', { class: 'hl-detail' });
      return E;
    };

    // Positions: the current set, a point's data coordinates, the whole view, screen coordinates.
    var curSet = function (E) { return E.sets[E.st.set]; };
    var xyOf = function (E, s, i) {
      var a = s.xy[E.st.proj][E.st.layer];
      return [a.rx[0] + a.x[i] * (a.rx[1] - a.rx[0]) / 65535, a.ry[0] + a.y[i] * (a.ry[1] - a.ry[0]) / 65535];
    };
    var fullView = function (E) {
      var a = curSet(E).xy[E.st.proj][E.st.layer], px = (a.rx[1] - a.rx[0]) * 0.05, py = (a.ry[1] - a.ry[0]) * 0.05;
      return { x0: a.rx[0] - px, x1: a.rx[1] + px, y0: a.ry[0] - py, y1: a.ry[1] + py };
    };
    var sx = function (E, x) { var v = E.st.view; return PX + (x - v.x0) / (v.x1 - v.x0) * PS; };
    var sy = function (E, y) { var v = E.st.view; return PY + PS - (y - v.y0) / (v.y1 - v.y0) * PS; };

    // Texts: a field's value of point i, and the tooltip of point i.
    var fieldText = function (f, i) {
      if (f.kind === 'cat') return f.names[f.v[i]];
      if (f.kind === 'bool') return f.v[i] ? 'yes' : 'no';
      if (f.kind === 'float') return fmt(f.v[i]);
      return String(f.v[i]);
    };
    var hoverLines = function (E, i) {
      var s = curSet(E);
      var lines = [s.raw.name + ' problem ' + s.index[i], 'layer ' + E.D.layers[E.st.layer]];
      s.fields.forEach(function (f) { lines.push(f.name + ': ' + fieldText(f, i)); });
      return lines;
    };

    // The axes' grid, ticks and titles of the current view.
    var drawAxes = function (E) {
      var axes = E.g.axes, v = E.st.view, p = E.D.projections[E.st.proj];
      clear(axes);
      nice(v.x0, v.x1, 6).forEach(function (t) {
        var x = sx(E, t);
        el(axes, 'line', { x1: x, x2: x, y1: PY, y2: PY + PS, class: 'hl-grid' });
        el(axes, 'text', { x: x, y: PY + PS + 15, 'text-anchor': 'middle', class: 'hl-small' }, fmt(t));
      });
      nice(v.y0, v.y1, 6).forEach(function (t) {
        var y = sy(E, t);
        el(axes, 'line', { x1: PX, x2: PX + PS, y1: y, y2: y, class: 'hl-grid' });
        el(axes, 'text', { x: PX - 5, y: y + 4, 'text-anchor': 'end', class: 'hl-small' }, fmt(t));
      });
      el(axes, 'text', { x: PX + PS / 2, y: PY + PS + 34, 'text-anchor': 'middle' }, p.axes[0]);
      el(axes, 'text', { x: 16, y: PY + PS / 2, 'text-anchor': 'middle', transform: 'rotate(-90 16 ' + (PY + PS / 2) + ')' }, p.axes[1]);
    };
    // The points moved to the current view, and the axes redrawn.
    var place = function (E) {
      var s = curSet(E);
      E.circles.forEach(function (c, i) {
        var p = xyOf(E, s, i);
        c.setAttribute('cx', sx(E, p[0]).toFixed(1));
        c.setAttribute('cy', sy(E, p[1]).toFixed(1));
      });
      drawAxes(E);
    };
    // The points' colours and visibility under the current colouring.
    var paint = function (E) {
      var st = E.st, lab = curSet(E).colors[st.color], C = E.D.colorings[st.color], hid = st.hidden[st.color];
      E.circles.forEach(function (c, i) {
        var k = lab[i];
        c.setAttribute('fill', C.colors[k]);
        c.setAttribute('data-class', k);
        c.setAttribute('display', hid[k] ? 'none' : 'inline');
      });
    };
    // One circle per point of the current set.
    var drawPoints = function (E) {
      clear(E.g.pts);
      E.circles = [];
      var s = curSet(E);
      for (var i = 0; i < s.n; i++) {
        E.circles.push(el(E.g.pts, 'circle', { r: 3, class: 'hl-pt' + (i === E.st.sel ? ' sel' : ''), 'fill-opacity': 0.75, 'data-i': i, 'data-index': s.index[i] }));
      }
      paint(E);
      place(E);
    };
    // The legend of the current colouring: its classes present in the set, each a hide / show toggle.
    var drawLegend = function (E) {
      var legend = E.g.legend, C = E.D.colorings[E.st.color], hid = E.st.hidden[E.st.color], s = curSet(E), lab = s.colors[E.st.color];
      clear(legend);
      var counts = C.classes.map(function () { return 0; });
      for (var i = 0; i < s.n; i++) counts[lab[i]]++;
      var x = PX + PS + 16, y = PY + 6;
      el(legend, 'text', { x: x, y: y + 8, 'font-weight': 'bold' }, C.name);
      el(legend, 'text', { x: x, y: y + 22, class: 'hl-small' }, '(click to hide / show)');
      C.classes.forEach(function (name, k) {
        if (!counts[k]) return;
        y += 19;
        var g = el(legend, 'g', { class: 'hl-leg' + (hid[k] ? ' off' : ''), 'data-class': k, transform: 'translate(' + x + ',' + (y + 16) + ')' });
        el(g, 'circle', { cx: 5, cy: 0, r: 5, fill: C.colors[k] });
        el(g, 'text', { x: 15, y: 4 }, name + ' (' + counts[k] + ')');
        g.addEventListener('click', function () {
          hid[k] = !hid[k];
          g.setAttribute('class', 'hl-leg' + (hid[k] ? ' off' : ''));
          paint(E);
        });
      });
    };
    // The switchers of set, layer, projection and colouring, and the usage line.
    var drawControls = function (E) {
      var controls = E.g.controls, st = E.st, D = E.D;
      clear(controls);
      var x = 12, y = 34;
      x = switcher(controls, x, y, 'set', E.sets.map(function (s) { return s.raw.name; }), st.set, function (k) { st.set = k; st.sel = -1; st.view = fullView(E); redraw(E); });
      x = switcher(controls, x, y, 'layer', D.layers, st.layer, function (k) { st.layer = k; st.view = fullView(E); redraw(E); });
      if (D.projections.length > 1) x = switcher(controls, x, y, 'projection', D.projections.map(function (p) { return p.name; }), st.proj, function (k) { st.proj = k; st.view = fullView(E); redraw(E); });
      if (D.colorings.length > 1) switcher(controls, x, y, 'colour', D.colorings.map(function (c) { return c.name; }), st.color, function (k) { st.color = k; redraw(E); });
      el(controls, 'text', { x: PX, y: PY + PS + 52, class: 'hl-small' }, 'wheel: zoom, drag: pan, double-click: reset; click a point for its problem');
    };
    // The detail of point i: its SRAVEN problem as nine panels (the site's tokens marked) and its
    // answer; returns the y below it.
    var drawProblem = function (E, i, y) {
      var detail = E.g.detail, X = DETAIL_X, P = curSet(E).problems, D = E.D;
      var F = P.F, cw = 106, ch = 30, fw = (cw - 10) / F;
      var base = i * 9 * F;
      for (var p = 0; p < 9; p++) {
        var gx = X + (p % 3) * (cw + 4), gy = y + Math.floor(p / 3) * (ch + 22);
        el(detail, 'text', { x: gx, y: gy + 11, class: 'hl-small' }, p < 8 ? 'panel ' + p : 'answer');
        var g = el(detail, 'g', { class: 'hl-panel', 'data-panel': p, transform: 'translate(' + gx + ',' + (gy + 14) + ')' });
        el(g, 'rect', { width: cw, height: ch, fill: p < 8 ? '#fafafa' : '#fff7e6', stroke: '#bbb' });
        for (var f = 0; f < F; f++) {
          var v = P.values[base + p * F + f], t = p * F + f;
          var cell = el(g, 'g', { class: 'hl-feat', 'data-feature': f, 'data-value': v, transform: 'translate(' + (5 + f * fw) + ',5)' });
          el(cell, 'rect', { width: fw - 3, height: ch - 10, fill: D.colorings[0].colors[v % D.colorings[0].colors.length] || '#ccc', 'fill-opacity': 0.35 });
          el(cell, 'text', { x: (fw - 3) / 2, y: 15, 'text-anchor': 'middle' }, String(v));
          if (P.marked.indexOf(t) >= 0 || t === P.query) el(cell, 'rect', { x: -1, y: -1, width: fw - 1, height: ch - 8, class: 'hl-mark' });
        }
      }
      y += 3 * (ch + 22) + 6;
      var slot = P.slot[i], pred = P.prediction[i], truth = P.values[base + 8 * F + slot];
      el(detail, 'text', { x: X, y: y, class: 'hl-answer' }, 'slot ' + slot + ': true ' + truth + ', model ' + pred + (pred === truth ? ' (right)' : ' (wrong)'));
      y += 14;
      el(detail, 'text', { x: X, y: y, class: 'hl-small' }, 'red: the site\'s query and key tokens');
      return y + 10;
    };
    // The detail of point i: its code at the current layer, heads by keys, each cell hoverable;
    // returns the y below it.
    var drawCode = function (E, i, y) {
      var detail = E.g.detail, X = DETAIL_X, D = E.D, svg = E.svg, tip = E.tip;
      var c = curSet(E).codes[E.st.layer], H = D.heads.length, K = D.keys.length, hk = H * K;
      var cs = Math.max(6, Math.min(20, Math.floor((E.W - X - 44) / H)));
      y += 10;
      el(detail, 'text', { x: X, y: y, class: 'hl-small' }, 'its code at layer ' + D.layers[E.st.layer] + ' (query to keys, per head):');
      y += 6;
      for (var k = 0; k < K; k++) {
        el(detail, 'text', { x: X + 30, y: y + k * cs + cs / 2 + 4, 'text-anchor': 'end', class: 'hl-small' }, D.keys[k]);
        for (var h = 0; h < H; h++) {
          var val = c.r[0] + c.q[i * hk + h * K + k] * (c.r[1] - c.r[0]) / c.top;
          var r = el(detail, 'rect', { x: X + 34 + h * cs, y: y + k * cs, width: cs - 1, height: cs - 1, fill: ramp(val, c.r), class: 'hl-code', 'data-head': h, 'data-key': k });
          (function (h, k, val) {
            r.addEventListener('pointermove', function (ev) {
              var q = local(svg, ev);
              tip.show(q.x, q.y, [D.heads[h] + ' -> ' + D.keys[k], 'code \u2248 ' + fmt(val)]);
            });
            r.addEventListener('pointerleave', tip.hide);
          })(h, k, val);
        }
      }
      // Heads of one layer are labelled H<h>; heads of several layers keep their L<l> prefix.
      var layerOf = function (name) { var m = /^L\d+/.exec(name); return m ? m[0] : ''; };
      var oneLayer = D.heads.every(function (name) { return layerOf(name) === layerOf(D.heads[0]); });
      D.heads.forEach(function (name, h) {
        if (cs >= 22 || h % 2 === 0) el(detail, 'text', { x: X + 34 + h * cs + cs / 2, y: y + K * cs + 11, 'text-anchor': 'middle', class: 'hl-small' }, oneLayer ? name.replace(/^L\d+/, '') : name);
      });
      return y + K * cs + 24;
    };
    // The detail of point i: its fields, and the command that reproduces its problem set wrapped
    // at spaces.
    var drawFields = function (E, i, y) {
      var detail = E.g.detail, X = DETAIL_X, s = curSet(E);
      s.fields.forEach(function (f) {
        el(detail, 'text', { x: X, y: y, class: 'hl-field' }, f.name + ': ' + fieldText(f, i));
        y += 15;
      });
      var words = (s.raw.reproduce + ' (problem ' + s.index[i] + ')').split(' '), line = '';
      y += 4;
      words.forEach(function (w) {
        if ((line + ' ' + w).length > 52 && line) { el(detail, 'text', { x: X, y: y, class: 'hl-small hl-repro' }, line); y += 13; line = w; } else line = line ? line + ' ' + w : w;
      });
      if (line) el(detail, 'text', { x: X, y: y, class: 'hl-small hl-repro' }, line);
    };
    // The detail of the selected point (or the hint to click one).
    var drawDetail = function (E) {
      var detail = E.g.detail, s = curSet(E), i = E.st.sel;
      clear(detail);
      if (i < 0) {
        el(detail, 'text', { x: DETAIL_X, y: PY + 14, class: 'hl-small' }, 'Click a point to see its problem and its code.');
        return;
      }
      var y = PY + 10;
      el(detail, 'text', { x: DETAIL_X, y: y, 'font-weight': 'bold', class: 'hl-detail-title' }, s.raw.name + ' problem ' + s.index[i] + ', layer ' + E.D.layers[E.st.layer]);
      y += 10;
      if (s.problems) y = drawProblem(E, i, y);
      if (s.codes && E.D.heads.length) y = drawCode(E, i, y);
      drawFields(E, i, y);
    };
    var redraw = function (E) { drawControls(E); drawPoints(E); drawLegend(E); drawDetail(E); };

    // Hover shows a point's tooltip; a click selects it and shows its detail.
    var bindPoints = function (E) {
      var pts = E.g.pts, st = E.st;
      pts.addEventListener('pointerover', function (ev) {
        var i = ev.target.getAttribute && ev.target.getAttribute('data-i');
        if (i === null || i === undefined) return;
        var q = local(E.svg, ev);
        E.tip.show(q.x, q.y, hoverLines(E, +i));
      });
      pts.addEventListener('pointerout', E.tip.hide);
      pts.addEventListener('click', function (ev) {
        var i = ev.target.getAttribute && ev.target.getAttribute('data-i');
        if (i === null || i === undefined) return;
        if (st.sel >= 0 && E.circles[st.sel]) E.circles[st.sel].setAttribute('class', 'hl-pt');
        st.sel = +i;
        E.circles[st.sel].setAttribute('class', 'hl-pt sel');
        pts.appendChild(E.circles[st.sel]);
        drawDetail(E);
      });
    };
    // The wheel zooms about the pointer, a drag of the background pans, a double click resets.
    var bindZoomPan = function (E) {
      var svg = E.svg, bg = E.g.bg, st = E.st, drag = null;
      var zoomAt = function (ev, f) {
        var q = local(svg, ev), v = st.view;
        var cx = v.x0 + (q.x - PX) / PS * (v.x1 - v.x0), cy = v.y0 + (PY + PS - q.y) / PS * (v.y1 - v.y0);
        st.view = { x0: cx + (v.x0 - cx) * f, x1: cx + (v.x1 - cx) * f, y0: cy + (v.y0 - cy) * f, y1: cy + (v.y1 - cy) * f };
        place(E);
      };
      [bg, E.g.pts].forEach(function (t) {
        t.addEventListener('wheel', function (ev) { ev.preventDefault(); zoomAt(ev, ev.deltaY > 0 ? 1.2 : 1 / 1.2); }, { passive: false });
        t.addEventListener('dblclick', function () { st.view = fullView(E); place(E); });
      });
      bg.addEventListener('pointerdown', function (ev) { drag = { p: local(svg, ev), v: st.view }; bg.setPointerCapture && bg.setPointerCapture(ev.pointerId); });
      bg.addEventListener('pointermove', function (ev) {
        if (!drag) return;
        var q = local(svg, ev), v = drag.v;
        var dx = (q.x - drag.p.x) / PS * (v.x1 - v.x0), dy = (q.y - drag.p.y) / PS * (v.y1 - v.y0);
        st.view = { x0: v.x0 - dx, x1: v.x1 - dx, y0: v.y0 + dy, y1: v.y1 + dy };
        place(E);
      });
      bg.addEventListener('pointerup', function () { drag = null; });
    };
    var explorer = function (svg, D) {
      var E = explorerContext(svg, D);
      bindPoints(E);
      bindZoomPan(E);
      E.st.view = fullView(E);
      redraw(E);
      svg.hlState = E.st;
    };

    // ---- the cell grid of the pattern viewer and the heatmap ---------------------------
    // R x C cells with row and column labels (every n-th when cells are small), a frame,
    // optional separators every n cells and axis titles, and a colour bar at bx. L: the layout
    // {x0, y0, s} (s: the side of the largest dimension), or null to fit the labels. hover(i, j)
    // gives the tooltip's lines for cell (i, j). Returns paint(fill(i, j)) and bar(lut, range,
    // name).
    var cellGrid = function (svg, R, C, rows, cols, L, o, hover) {
      var tip = tooltip(svg);
      var longest = function (v) { return Math.max.apply(null, v.map(function (s) { return s.length; })); };
      var lw = Math.min(90, 8 + 6 * longest(rows));
      var X0 = L ? L.x0 : 16 + lw, Y0 = L ? L.y0 : 76;
      var S = L ? L.s : Math.min(500, 560 - 12 * Math.min(8, longest(cols)));
      var cs = S / Math.max(R, C);
      var cells = el(svg, 'g', { class: 'hl-cells' });
      var rects = [];
      for (var i = 0; i < R; i++) {
        for (var j = 0; j < C; j++) rects.push(el(cells, 'rect', { x: (X0 + j * cs).toFixed(2), y: (Y0 + i * cs).toFixed(2), width: (cs + 0.3).toFixed(2), height: (cs + 0.3).toFixed(2), 'data-row': i, 'data-col': j }));
      }
      var fs = Math.max(6, Math.min(11, cs - 1));
      var every = Math.max(1, Math.ceil(8 / cs));
      rows.forEach(function (s, i) { if (i % every === 0) el(svg, 'text', { x: X0 - 4, y: Y0 + (i + 0.5) * cs + fs / 3, 'text-anchor': 'end', 'font-size': fs }, s); });
      var colExt = 0;
      cols.forEach(function (s, j) {
        if (j % every !== 0) return;
        var x = X0 + (j + 0.5) * cs, y = Y0 + R * cs + 6;
        colExt = Math.max(colExt, 6 + 0.55 * fs * Math.min(24, s.length) * 0.87);
        el(svg, 'text', { x: x, y: y, 'text-anchor': 'end', 'font-size': fs, transform: 'rotate(-60 ' + x + ' ' + y + ')' }, s);
      });
      if (o.separators) {
        for (var k = o.separators; k < Math.max(R, C); k += o.separators) {
          if (k < C) el(svg, 'line', { x1: X0 + k * cs, x2: X0 + k * cs, y1: Y0, y2: Y0 + R * cs, stroke: '#333', 'stroke-width': 1.5, 'pointer-events': 'none' });
          if (k < R) el(svg, 'line', { x1: X0, x2: X0 + C * cs, y1: Y0 + k * cs, y2: Y0 + k * cs, stroke: '#333', 'stroke-width': 1.5, 'pointer-events': 'none' });
        }
      }
      el(svg, 'rect', { x: X0, y: Y0, width: C * cs, height: R * cs, class: 'hl-frame' });
      if (o.xLabel) el(svg, 'text', { x: X0 + C * cs / 2, y: Y0 + R * cs + colExt + 18, 'text-anchor': 'middle', class: 'hl-axis' }, o.xLabel);
      if (o.yLabel) {
        var ly = Y0 + R * cs / 2;
        el(svg, 'text', { x: 18, y: ly, 'text-anchor': 'middle', class: 'hl-axis', transform: 'rotate(-90 18 ' + ly + ')' }, o.yLabel);
      }
      var bx = X0 + C * cs + 20;
      var barG = el(svg, 'g', { class: 'hl-bar' });
      cells.addEventListener('pointermove', function (ev) {
        var t = ev.target;
        if (!t.getAttribute || t.getAttribute('data-row') === null) return;
        var p = local(svg, ev);
        tip.show(p.x, p.y, hover(+t.getAttribute('data-row'), +t.getAttribute('data-col')));
      });
      cells.addEventListener('pointerleave', tip.hide);
      return {
        bx: bx,
        Y0: Y0,
        paint: function (fill) {
          rects.forEach(function (e, k) { e.setAttribute('fill', fill(Math.floor(k / C), k % C)); });
        },
        bar: function (lut, r, name) {
          clear(barG);
          for (var k = 0; k < lut.length; k++) el(barG, 'rect', { x: bx, y: Y0 + (lut.length - 1 - k) * (200 / lut.length), width: 14, height: 200 / lut.length + 0.5, fill: lut[k] });
          el(barG, 'text', { x: bx + 18, y: Y0 + 8, class: 'hl-small' }, fmt(r[1]));
          el(barG, 'text', { x: bx + 18, y: Y0 + 200, class: 'hl-small' }, fmt(r[0]));
          el(barG, 'text', { x: bx, y: Y0 + 218, class: 'hl-small' }, name);
        }
      };
    };
    // Colour of v on range r through a lookup table of the figure's colour map.
    var lutColour = function (lut, r, v) {
      var t = Math.max(0, Math.min(1, (v - r[0]) / (r[1] - r[0])));
      return lut[Math.round(t * (lut.length - 1))];
    };
    // Values of a {exact} (f32) or {q, r} (8 bits over r) object, by flat index.
    var cellValues = function (V) {
      var exact = V.exact ? dec(V.exact) : null, q = exact ? null : dec(V.q);
      return { exact: !!exact, at: function (k) { return exact ? exact[k] : V.r[0] + q[k] * (V.r[1] - V.r[0]) / 255; } };
    };

    // ---- attention patterns -------------------------------------------------------------
    var patterns = function (svg, D) {
      var L = D.shape[0], H = D.shape[1], R = D.shape[2], C = D.shape[3];
      var V = cellValues(D.values);
      var at = function (l, h, i, j) { return V.at(((l * H + h) * R + i) * C + j); };
      var st = { layer: D.start, head: 0 };
      el(svg, 'text', { x: 12, y: 22, class: 'hl-title' }, D.title);
      var controls = el(svg, 'g', { class: 'hl-controls' });
      var g = cellGrid(svg, R, C, D.rows, D.cols, null, {}, function (i, j) {
        var head = (L > 1 ? D.layers[st.layer] + ' ' : '') + (H > 1 ? D.heads[st.head] : '');
        var lines = [D.rowName + ' ' + D.rows[i] + ' -> ' + D.colName + ' ' + D.cols[j], D.valueName + (V.exact ? ' ' : ' \u2248 ') + fmt(at(st.layer, st.head, i, j))];
        if (head) lines.unshift(head);
        return lines;
      });
      g.bar(D.lut, D.range, D.valueName);
      var paint = function () { g.paint(function (i, j) { return lutColour(D.lut, D.range, at(st.layer, st.head, i, j)); }); };
      var drawControls = function () {
        clear(controls);
        if (L > 1) switcher(controls, 12, 34, 'layer', D.layers, st.layer, function (k) { st.layer = k; drawControls(); paint(); });
        if (H > 1) {
          var hx = g.bx + 70, per = 4;
          el(controls, 'text', { x: hx, y: g.Y0 + 8, class: 'hl-small' }, 'head:');
          D.heads.forEach(function (name, h) {
            button(controls, hx + (h % per) * 44, g.Y0 + 16 + Math.floor(h / per) * 24, name, h === st.head, function () { st.head = h; drawControls(); paint(); });
          });
        }
      };
      drawControls();
      paint();
      svg.hlState = st;
    };

    // ---- heatmaps (one or more panels over the same rows and columns) -------------------
    var heatmap = function (svg, D) {
      var R = D.rows.length, C = D.cols.length;
      var panels = D.panels.map(function (p) { return { raw: p, v: cellValues(p.values), mask: p.mask ? dec(p.mask) : null }; });
      var st = { panel: D.start };
      var title = el(svg, 'text', { x: 12, y: 22, class: 'hl-title' });
      var controls = el(svg, 'g', { class: 'hl-controls' });
      var g = cellGrid(svg, R, C, D.rows, D.cols, D.layout, { separators: D.separators, xLabel: D.xLabel, yLabel: D.yLabel }, function (i, j) {
        var P = panels[st.panel], k = i * C + j;
        var value = P.mask && P.mask[k] ? ': ' + D.masked : (P.v.exact ? ': ' : ' \u2248 ') + fmt(P.v.at(k));
        var lines = [D.rowName + ': ' + D.rows[i], D.colName + ': ' + D.cols[j], P.raw.valueName + value];
        if (panels.length > 1) lines.unshift(P.raw.name);
        return lines;
      });
      var show = function () {
        var P = panels[st.panel], p = P.raw;
        title.textContent = p.title;
        g.bar(p.lut, p.range, p.valueName);
        g.paint(function (i, j) {
          var k = i * C + j;
          return P.mask && P.mask[k] ? '#eeeeee' : lutColour(p.lut, p.range, P.v.at(k));
        });
        clear(controls);
        if (panels.length > 1) switcher(controls, 12, 34, 'show', panels.map(function (q) { return q.raw.name; }), st.panel, function (k) { st.panel = k; show(); });
      };
      show();
      svg.hlState = st;
    };

    hl.boot = function () {
      var figs = document.querySelectorAll('svg.hl-fig');
      for (var i = 0; i < figs.length; i++) {
        var svg = figs[i];
        if (svg.hlBooted) continue;
        var data = svg.querySelector('.hl-data');
        if (!data) continue;
        svg.hlBooted = true;
        var ns = svg.querySelector('.hl-noscript');
        if (ns) ns.parentNode.removeChild(ns);
        var D = JSON.parse(data.textContent);
        var kind = svg.getAttribute('data-hl-kind');
        if (kind === 'explorer') explorer(svg, D);
        else if (kind === 'heatmap') heatmap(svg, D);
        else patterns(svg, D);
      }
    };
  }
  hl.boot();
})();
