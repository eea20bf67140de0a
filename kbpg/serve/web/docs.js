// kbpg's API docs: renders /openapi.json as plain HTML (Swagger UI would need a CDN).
"use strict";

function resolve(spec, schema) {
  let seen = 0;
  while (schema && schema.$ref && seen++ < 10) {
    const path = schema.$ref.replace(/^#\//, "").split("/");
    schema = path.reduce((node, key) => (node ? node[key] : undefined), spec);
  }
  return schema || {};
}

function typeName(spec, schema) {
  schema = resolve(spec, schema);
  if (schema.anyOf) {
    return schema.anyOf
      .map((s) => typeName(spec, s))
      .filter((t) => t !== "null")
      .join(" | ");
  }
  if (schema.type === "array") return typeName(spec, schema.items) + "[]";
  return schema.title && !schema.type ? schema.title : schema.type || "object";
}

function limits(schema) {
  const parts = [];
  for (const s of [schema, ...(schema.anyOf || [])]) {
    if (s.minimum !== undefined) parts.push("≥ " + s.minimum);
    if (s.maximum !== undefined) parts.push("≤ " + s.maximum);
    if (s.minLength !== undefined) parts.push("min length " + s.minLength);
  }
  return parts.join(", ");
}

function fieldsTable(spec, schema) {
  schema = resolve(spec, schema);
  const properties = schema.properties || {};
  const required = new Set(schema.required || []);
  const table = element("table");
  const head = table.createTHead().insertRow();
  for (const title of ["field", "type", "limits", "description"]) {
    head.append(element("th", "", title));
  }
  const body = table.createTBody();
  for (const [name, property] of Object.entries(properties)) {
    const row = body.insertRow();
    const cell = row.insertCell();
    cell.append(element("code", "", name + (required.has(name) ? " *" : "")));
    row.insertCell().textContent = typeName(spec, property);
    row.insertCell().textContent = limits(property);
    row.insertCell().textContent = property.description || "";
  }
  const wrap = element("div", "table-wrap");
  wrap.append(table);
  return wrap;
}

function operation(spec, path, method, op) {
  const box = element("section", "op");
  const title = element("h2");
  title.append(element("span", "method", method.toUpperCase()), path);
  box.append(title);
  if (op.summary) box.append(element("p", "", op.summary));
  if (op.description) box.append(element("p", "", op.description));
  const content = op.requestBody && op.requestBody.content;
  const json = content && content["application/json"];
  if (json) {
    box.append(element("h3", "", "Request body (JSON; * required)"));
    box.append(fieldsTable(spec, json.schema));
  }
  const responses = element("ul");
  for (const [code, response] of Object.entries(op.responses || {})) {
    const schema = response.content && response.content["application/json"];
    const shape = schema ? " — " + typeName(spec, schema.schema) : "";
    responses.append(element("li", "", code + " " + (response.description || "") + shape));
  }
  box.append(element("h3", "", "Responses"), responses);
  return box;
}

async function main() {
  try {
    const response = await fetch("/openapi.json");
    if (!response.ok) throw new Error("the server answered " + response.status);
    const spec = await response.json();
    const target = $("operations");
    for (const [path, methods] of Object.entries(spec.paths || {})) {
      for (const [method, op] of Object.entries(methods)) {
        target.append(operation(spec, path, method, op));
      }
    }
    const schemas = (spec.components && spec.components.schemas) || {};
    for (const name of ["SearchResponse", "Chunk", "Source", "ErrorResponse"]) {
      if (!schemas[name]) continue;
      const box = element("section", "op");
      box.append(element("h2", "", name));
      if (schemas[name].description) box.append(element("p", "", schemas[name].description));
      box.append(fieldsTable(spec, schemas[name]));
      target.append(box);
    }
    $("status").textContent = (spec.info ? spec.info.title + " " + spec.info.version : "") +
      (spec.info && spec.info.summary ? " — " + spec.info.summary : "");
  } catch (error) {
    $("status").textContent = "Could not load /openapi.json: " + error.message;
  }
}

main();
