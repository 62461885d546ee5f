// A JSON-schema checker for the schemas pydantic emits (the fork form's edits).

/** Problems of `value` against `schema`: [{path, message}], empty when it validates. */
export function validateSchema(schema, value) {
  const problems = [];
  checkSchema(schema, value, "$", schema, problems, 0);
  return problems;
}

function resolveRef(ref, root) {
  if (!ref.startsWith("#/")) return undefined;
  let node = root;
  for (const part of ref.slice(2).split("/")) {
    const key = part.replace(/~1/g, "/").replace(/~0/g, "~");
    if (node === null || typeof node !== "object" || !(key in node)) return undefined;
    node = node[key];
  }
  return node;
}

function jsonType(value) {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "integer" : "number";
  return typeof value;
}

function deepEqual(a, b) {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(value) {
  if (Array.isArray(value)) return value.map(canonical);
  if (value && typeof value === "object") {
    const out = {};
    for (const key of Object.keys(value).sort()) out[key] = canonical(value[key]);
    return out;
  }
  return value;
}

function childPath(path, key) {
  return typeof key === "number"
    ? `${path}[${key}]`
    : /^[A-Za-z_][A-Za-z0-9_]*$/.test(key)
      ? `${path}.${key}`
      : `${path}[${JSON.stringify(key)}]`;
}

function checkSchema(schema, value, path, root, problems, depth) {
  if (schema === true || schema === undefined || schema === null) return;
  if (schema === false) {
    problems.push({ path, message: "no value is allowed here" });
    return;
  }
  if (depth > 64) return;
  if (schema.$ref) {
    const target = resolveRef(schema.$ref, root);
    if (target === undefined) problems.push({ path, message: `unknown $ref ${schema.$ref}` });
    else checkSchema(target, value, path, root, problems, depth + 1);
  }
  for (const sub of schema.allOf || []) checkSchema(sub, value, path, root, problems, depth + 1);
  for (const [word, need] of [["anyOf", "any"], ["oneOf", "one"]]) {
    const options = schema[word];
    if (!options) continue;
    const results = options.map((sub) => {
      const found = [];
      checkSchema(sub, value, path, root, found, depth + 1);
      return found;
    });
    const passing = results.filter((r) => r.length === 0).length;
    if (need === "any" && passing === 0) {
      const best = results.reduce((a, b) => (b.length < a.length ? b : a));
      problems.push(...(options.length === 1 ? best : [{ path, message: describeOptions(options, root, best) }]));
    } else if (need === "one" && passing !== 1) {
      problems.push({ path, message: `must match exactly one of ${options.length} schemas (matches ${passing})` });
    }
  }
  if ("const" in schema && !deepEqual(schema.const, value))
    problems.push({ path, message: `must be ${JSON.stringify(schema.const)}` });
  if (schema.enum && !schema.enum.some((option) => deepEqual(option, value)))
    problems.push({ path, message: `must be one of ${schema.enum.map((v) => JSON.stringify(v)).join(", ")}` });
  const actual = jsonType(value);
  if (schema.type) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    const ok = types.some((t) => t === actual || (t === "number" && actual === "integer"));
    if (!ok) {
      problems.push({ path, message: `must be ${types.join(" or ")}, not ${actual}` });
      return;
    }
  }
  if (actual === "object") {
    const properties = schema.properties || {};
    for (const name of schema.required || []) {
      if (!(name in value)) problems.push({ path, message: `${JSON.stringify(name)} is required` });
    }
    for (const [name, item] of Object.entries(value)) {
      if (name in properties) {
        checkSchema(properties[name], item, childPath(path, name), root, problems, depth + 1);
      } else if (schema.additionalProperties === false) {
        problems.push({ path: childPath(path, name), message: "is not an allowed field" });
      } else if (schema.additionalProperties && typeof schema.additionalProperties === "object") {
        checkSchema(schema.additionalProperties, item, childPath(path, name), root, problems, depth + 1);
      }
    }
  } else if (actual === "array") {
    const prefix = schema.prefixItems || [];
    value.forEach((item, i) => {
      const sub = i < prefix.length ? prefix[i] : schema.items;
      if (sub !== undefined) checkSchema(sub, item, childPath(path, i), root, problems, depth + 1);
    });
    if (schema.minItems !== undefined && value.length < schema.minItems)
      problems.push({ path, message: `must have at least ${schema.minItems} item(s)` });
    if (schema.maxItems !== undefined && value.length > schema.maxItems)
      problems.push({ path, message: `must have at most ${schema.maxItems} item(s)` });
  } else if (actual === "string") {
    const length = [...value].length;
    if (schema.minLength !== undefined && length < schema.minLength)
      problems.push({ path, message: `must be at least ${schema.minLength} character(s) long` });
    if (schema.maxLength !== undefined && length > schema.maxLength)
      problems.push({ path, message: `must be at most ${schema.maxLength} character(s) long` });
    if (schema.pattern !== undefined) {
      let re = null;
      try {
        re = new RegExp(schema.pattern, "u");
      } catch {
        re = null;
      }
      if (re && !re.test(value)) problems.push({ path, message: `must match ${schema.pattern}` });
    }
  } else if (actual === "number" || actual === "integer") {
    if (schema.minimum !== undefined && value < schema.minimum)
      problems.push({ path, message: `must be at least ${schema.minimum}` });
    if (schema.maximum !== undefined && value > schema.maximum)
      problems.push({ path, message: `must be at most ${schema.maximum}` });
    if (schema.exclusiveMinimum !== undefined && value <= schema.exclusiveMinimum)
      problems.push({ path, message: `must be more than ${schema.exclusiveMinimum}` });
    if (schema.exclusiveMaximum !== undefined && value >= schema.exclusiveMaximum)
      problems.push({ path, message: `must be less than ${schema.exclusiveMaximum}` });
    if (schema.multipleOf && Math.abs(value / schema.multipleOf - Math.round(value / schema.multipleOf)) > 1e-9)
      problems.push({ path, message: `must be a multiple of ${schema.multipleOf}` });
  }
}

function describeOptions(options, root, best) {
  const names = options.map((option) => {
    const target = option.$ref ? resolveRef(option.$ref, root) : option;
    return (target && (target.title || target.type)) || "schema";
  });
  const hint = best.length ? ` (closest: ${best[0].path} ${best[0].message})` : "";
  return `must be one of: ${names.join(", ")}${hint}`;
}
