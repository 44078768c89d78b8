// Building the page from data: every value a text node or an attribute, never parsed as HTML,
// so a request body or a key's name that holds markup shows as the text it is.

const SVG = "http://www.w3.org/2000/svg";

export function el(tag, attributes = {}, ...children) {
  // An <svg> made as HTML would draw nothing: it belongs to the SVG namespace.
  const made = tag === "svg" ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) made.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(made.dataset, value);
    else made.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    made.append(child instanceof Node ? child : String(child));
  }
  return made;
}

export const dollars = (value) => "$" + Number(value || 0).toFixed(4);
export const count = (value) => Number(value || 0).toLocaleString("en-US");
export const when = (iso) => iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z") : "–";

export function table(columns, rows, rowAttributes = () => ({})) {
  return el("table", {},
    el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", {}, label)))),
    el("tbody", {}, rows.length ? rows.map((row) => el("tr", rowAttributes(row),
      columns.map(([, cell]) => el("td", {}, cell(row))))) :
      el("tr", {}, el("td", {colspan: columns.length, class: "dim"}, "nothing yet"))));
}

export function field(label, input) {
  return el("label", {class: "field"}, el("span", {}, label), input);
}

export function card(title, ...children) {
  return el("section", {class: "card"}, el("h2", {}, title), ...children);
}
