// The status page's line chart (gateway/static/status.html), as a module: drawn at the SVG's
// own size (text is never stretched), y from 0 to a round top, both labelled; x labelled by
// `label` every `step` (a minute for traffic, a day for spend).

const SVG = "http://www.w3.org/2000/svg";

export function shape(name, attributes, text) {
  const made = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) made.setAttribute(key, value);
  if (text !== undefined) made.textContent = text;
  return made;
}

// The smallest 1, 2 or 5 times a power of ten at or above `value`: the y axis's top.
export function roundUp(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((m) => m * power).find((top) => top >= value * (1 - 1e-9));
}

export const clockTime = (t) => {
  const at = new Date(t * 1000);
  return `${String(at.getHours()).padStart(2, "0")}:${String(at.getMinutes()).padStart(2, "0")}`;
};
export const dayOf = (t) => new Date(t * 1000).toISOString().slice(5, 10);
export const number = (value) => Number(value.toPrecision(3)).toString();

export function chart(svg, times, series, format, least,
                      {step = 60, label = clockTime, every = 1} = {}) {
  const box = svg.getBoundingClientRect();
  const width = Math.max(200, Math.round(box.width || 300));
  const height = Math.max(120, Math.round(box.height || 190));
  const left = 54, right = 10, top = 10, bottom = 22;
  const values = series.flat().filter((v) => v !== null && v !== undefined);
  const max = roundUp(Math.max(least, ...values));
  const first = times[0] ?? 0, last = times[times.length - 1] ?? 1;
  const x = (t) => left + ((t - first) / Math.max(1, last - first)) * (width - left - right);
  const y = (v) => top + (1 - v / max) * (height - top - bottom);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.replaceChildren();
  svg.append(shape("line", {class: "grid", x1: left, x2: width - right, y1: y(max), y2: y(max)}),
             shape("line", {class: "grid", x1: left, x2: width - right,
                            y1: y(max / 2), y2: y(max / 2)}),
             shape("line", {class: "axis", x1: left, x2: width - right, y1: y(0), y2: y(0)}),
             shape("text", {class: "y-max", x: left - 6, y: y(max) + 4, "text-anchor": "end"},
                   format(max)),
             shape("text", {class: "y-min", x: left - 6, y: y(0) + 4, "text-anchor": "end"},
                   format(0)));
  let tick = 0;
  for (let t = Math.ceil(first / step) * step; t <= last; t += step, tick += 1) {
    if (tick % every) continue;
    const at = x(t);
    const anchor = at + 18 > width ? "end" : at - 18 < left ? "start" : "middle";
    svg.append(shape("line", {class: "axis", x1: at, x2: at, y1: y(0), y2: y(0) + 4}),
               shape("text", {class: "x", x: at, y: height - 4, "text-anchor": anchor},
                     label(t)));
  }
  const known = (v) => v !== null && v !== undefined;
  series.forEach((points, index) => {
    const cls = index ? "second" : "first";
    const drawn = points.map((v, i) => known(v) ?
      `${x(times[i]).toFixed(1)},${y(v).toFixed(1)}` : null).filter(Boolean).join(" ");
    svg.append(shape("polyline", {points: drawn, class: cls}));
    points.forEach((v, i) => {  // a value with none beside it is a dot, not an invisible line
      if (known(v) && !known(points[i - 1]) && !known(points[i + 1])) {
        svg.append(shape("circle", {cx: x(times[i]), cy: y(v), r: 3, class: cls}));
      }
    });
  });
}
