// Parse the Prometheus text exposition of /metrics into {name: value}; labelled series are summed
// per name (e.g. tgi_request_failure{err=...}). Shared by the dashboard and its tests.
"use strict";
function parsePrometheus(text) {
  const values = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const match = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
    if (!match) continue;
    const value = Number(match[3]);
    if (Number.isNaN(value)) continue;
    values[match[1]] = (values[match[1]] || 0) + value;
  }
  return values;
}
if (typeof module !== "undefined") module.exports = { parsePrometheus };
