// Renders /openapi.json as a readable page: endpoints grouped by tag, with
// their parameters, request body, answers and the schemas they refer to.
// Plain DOM, no dependencies, nothing loaded from elsewhere.

const METHODS = ["get", "put", "post", "patch", "delete"];

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

// refName is the component name a $ref points to.
const refName = (ref) => ref.split("/").pop();

function schemaLink(name) {
  return el("a", { href: "#schema-" + name }, name);
}

// schemaText describes a schema in one line: a link for a $ref, else its type.
function schemaNode(s) {
  if (!s || Object.keys(s).length === 0) return el("span", { class: "muted" }, "any");
  if (s.$ref) return schemaLink(refName(s.$ref));
  if (s.oneOf) return joinNodes(s.oneOf.map(schemaNode), " or ");
  if (s.allOf) return joinNodes(s.allOf.map(schemaNode), " and ");
  if (s.type === "array") return el("span", {}, "array of ", schemaNode(s.items || {}));
  let t = Array.isArray(s.type) ? s.type.join(" or ") : (s.type || "any");
  if (s.format) t += ` (${s.format})`;
  if (s.enum) t += ": " + s.enum.join(", ");
  if (s.minimum !== undefined || s.maximum !== undefined) t += ` [${s.minimum ?? ""}..${s.maximum ?? ""}]`;
  if (s.type === "object" && s.properties) return propsTable(s);
  return el("code", {}, t);
}

function joinNodes(nodes, sep) {
  const span = el("span");
  nodes.forEach((n, i) => { if (i) span.append(sep); span.append(n); });
  return span;
}

function propsTable(s) {
  const req = new Set(s.required || []);
  const tb = el("tbody");
  for (const [name, p] of Object.entries(s.properties || {})) {
    tb.append(el("tr", {}, el("td", {}, el("code", {}, name), req.has(name) ? "" : el("span", { class: "muted" }, " optional")),
      el("td", {}, schemaNode(p)), el("td", { class: "muted" }, p.description || "")));
  }
  return el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "field"), el("th", {}, "type"), el("th", {}, ""))), tb);
}

function resolve(doc, obj) {
  if (obj && obj.$ref) return doc.components.responses[refName(obj.$ref)] || obj;
  return obj;
}

function contentNode(content) {
  const d = el("div");
  for (const [type, media] of Object.entries(content || {})) {
    d.append(el("div", {}, el("code", {}, type), " ", schemaNode(media.schema)));
  }
  return d;
}

function operation(doc, path, method, op, shared) {
  const id = op.operationId;
  const box = el("section", { class: "op", id: "op-" + id, "data-path": path, "data-method": method.toUpperCase() },
    el("h3", {}, el("span", { class: "method m-" + method }, method), el("code", {}, path), el("span", { class: "muted" }, op.summary || "")));
  if (op.description) box.append(el("p", {}, op.description));
  const params = [...shared, ...(op.parameters || [])];
  if (params.length) {
    const tb = el("tbody");
    for (const p of params) {
      tb.append(el("tr", {}, el("td", {}, el("code", {}, p.name)), el("td", {}, p.in + (p.required ? ", required" : "")),
        el("td", {}, schemaNode(p.schema)), el("td", { class: "muted" }, p.description || "")));
    }
    box.append(el("h4", {}, "Parameters"), el("table", {}, tb));
  }
  if (op.requestBody) box.append(el("h4", {}, "Request body"), contentNode(op.requestBody.content));
  const tb = el("tbody");
  for (const [code, r0] of Object.entries(op.responses || {})) {
    const r = resolve(doc, r0);
    tb.append(el("tr", {}, el("td", {}, el("code", {}, code)), el("td", {}, r.description || ""), el("td", {}, contentNode(r.content))));
  }
  box.append(el("h4", {}, "Answers"), el("table", {}, tb));
  if (op.security && op.security.length === 0) box.append(el("p", { class: "muted" }, "No token needed."));
  return box;
}

async function main() {
  const res = await fetch("/openapi.json");
  const doc = await res.json();
  document.getElementById("version").textContent = `OpenAPI ${doc.openapi} · ${doc.info.title} v${doc.info.version}`;
  document.getElementById("intro").textContent = doc.info.description || "";
  const byTag = new Map((doc.tags || []).map((t) => [t.name, []]));
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const m of METHODS) {
      if (!item[m]) continue;
      const tag = (item[m].tags || ["other"])[0];
      if (!byTag.has(tag)) byTag.set(tag, []);
      byTag.get(tag).push([path, m, item[m], item.parameters || []]);
    }
  }
  const toc = el("ul"), ops = document.getElementById("ops");
  for (const [tag, list] of byTag) {
    if (!list.length) continue;
    ops.append(el("h2", { id: "tag-" + tag }, tag));
    for (const [path, m, op, shared] of list) {
      ops.append(operation(doc, path, m, op, shared));
      toc.append(el("li", {}, el("a", { href: "#op-" + op.operationId }, `${m.toUpperCase()} ${path}`)));
    }
  }
  document.getElementById("toc").append(toc);
  const schemas = document.getElementById("schemas");
  for (const [name, s] of Object.entries(doc.components.schemas || {})) {
    schemas.append(el("section", { class: "op", id: "schema-" + name }, el("h3", {}, name),
      s.description ? el("p", { class: "muted" }, s.description) : "", schemaNode({ ...s, description: undefined })));
  }
  document.getElementById("schemas-sec").hidden = false;
  document.body.dataset.state = "ready";
}

main().catch((err) => {
  document.getElementById("intro").textContent = "Could not load /openapi.json: " + err;
  document.body.dataset.state = "error";
});
