// Verify a quantdrift quantization certificate in Node.js, offline, from the document alone.
//
//   node examples/verify_certificate.js KEYS_JSON < certificate.json
//
// KEYS_JSON maps key ids to the signing keys of the ring, e.g. '{"ops": "...", "ml": "..."}'
// (QUANTDRIFT_SIGNING__KEYS). Node's built-in crypto only; no network, no other file.
// Prints {"ok", "signers", "problems", "route", "model"} as JSON; exits 0 when it verifies.
//
// The steps (docs/preflight.md, "Quantization certificate"; quantdrift.schemas.certificate):
// 1. HMAC-SHA256("quantdrift.certificate.v1\n" + payload) with keys[key_id] == signature.
//    The payload is verified as the string it is, never re-serialised.
// 2. The embedded preflight report: base64 bytes whose SHA-256 is report_sha256, verdict "go".
// 3. Its approvals: HMAC-SHA256 over four length-prefixed fields (4-byte big-endian length,
//    then UTF-8): the report's SHA-256 (hex), the signer's name, signed_at with 3 decimals,
//    the key id. At least `required` distinct names (distinct key ids with distinct_keys).
// 4. model == the report's subject.checkpoint, engine == its subject.engines.
// 5. live.sha256 == SHA-256 of live.text (when live evidence is attached).
const crypto = require("crypto");

const DOMAIN = Buffer.from("quantdrift.certificate.v1\n", "utf8");

function sha256hex(bytes) {
  return crypto.createHash("sha256").update(bytes).digest("hex");
}

function sameMac(hexGiven, expected) {
  const given = Buffer.from(String(hexGiven), "hex");
  return given.length === expected.length && crypto.timingSafeEqual(given, expected);
}

function field(text) {
  const bytes = Buffer.from(text, "utf8");
  const len = Buffer.alloc(4);
  len.writeUInt32BE(bytes.length);
  return Buffer.concat([len, bytes]);
}

function approvalProblem(sha, a, keys) {
  const key = keys[a.key_id];
  if (key === undefined) return `${a.by}: unknown key id ${JSON.stringify(a.key_id)}`;
  if (a.report_sha256 !== sha) return `${a.by}: signed another version of the report`;
  const at = Number(a.signed_at).toFixed(3);
  const message = Buffer.concat([field(sha), field(String(a.by)), field(at), field(a.key_id)]);
  const mac = crypto.createHmac("sha256", key).update(message).digest();
  return sameMac(a.signature, mac) ? null : `${a.by}: bad signature`;
}

// Key order does not matter to equality: compare with sorted keys.
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v && typeof v === "object") {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`;
  }
  return JSON.stringify(v === undefined ? null : v);
}

function verify(text, keys) {
  const env = JSON.parse(text);
  if (env.kind !== "quantdrift.certificate.v1" || typeof env.payload !== "string") {
    return { ok: false, signers: [], problems: ["not a quantdrift certificate"] };
  }
  const key = keys[env.key_id];
  if (key === undefined) {
    return { ok: false, signers: [], problems: [`unknown key id ${JSON.stringify(env.key_id)}`] };
  }
  const mac = crypto.createHmac("sha256", key).update(DOMAIN).update(Buffer.from(env.payload, "utf8")).digest();
  if (!sameMac(env.signature, mac)) {
    return { ok: false, signers: [], problems: ["bad signature: the certificate was altered or forged"] };
  }
  const payload = JSON.parse(env.payload);
  const pf = payload.preflight || {};
  const problems = [];
  const raw = Buffer.from(pf.report || "", "base64");
  const sha = sha256hex(raw);
  if (sha !== pf.report_sha256) problems.push("the embedded report does not match its SHA-256");
  const report = JSON.parse(raw.toString("utf8"));
  if (report.verdict !== "go") problems.push(`verdict is ${JSON.stringify(report.verdict)}, not 'go'`);
  const signers = new Map();
  for (const a of pf.approvals || []) {
    const why = approvalProblem(sha, a, keys);
    if (why) problems.push(why);
    else if (!signers.has(String(a.by))) signers.set(String(a.by), String(a.key_id));
  }
  const count = pf.distinct_keys ? new Set(signers.values()).size : signers.size;
  const required = Number(pf.required ?? 2);
  if (count < required) problems.push(`${count} distinct signers with a valid approval, ${required} needed`);
  const subject = report.subject || {};
  if (canonical(payload.model) !== canonical(subject.checkpoint ?? null)) {
    problems.push("model identity differs from the signed report's checkpoint");
  }
  if (canonical(payload.engine) !== canonical(subject.engines || {})) {
    problems.push("engine fingerprint differs from the signed report's engines");
  }
  if (payload.live && sha256hex(Buffer.from(String(payload.live.text), "utf8")) !== payload.live.sha256) {
    problems.push("the live evidence does not match its SHA-256");
  }
  const ok = problems.length === 0 && report.verdict === "go" && count >= required;
  return { ok, signers: [...signers.keys()].sort(), problems, route: payload.route, model: payload.model };
}

const keys = JSON.parse(process.argv[2] || "{}");
let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  let result;
  try {
    result = verify(input, keys);
  } catch (err) {
    result = { ok: false, signers: [], problems: [`unreadable: ${err.message}`] };
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(result.ok ? 0 : 1);
});
