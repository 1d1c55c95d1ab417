// Verify a quantdrift quantization certificate in Node.js, offline, from the document alone.
//
//   node examples/verify_certificate.js ISSUER.pub [APPROVER.pub ...] < certificate.json
//
// Each argument is a trusted Ed25519 public key as a PEM file (`quantdrift preflight keygen`
// writes KEY.pub; `openssl pkey -pubout` too). No secret is needed, so whoever verifies
// cannot forge. Node's built-in crypto only; no network, no other file.
// Prints {"ok", "key_id", "signers", "problems", "route", "model", "evidence"} as JSON (evidence:
// per route its pairs, time window, calibration and worst pairs by hash); exits 0 when it
// verifies.
//
// The steps (docs/preflight.md, "Quantization certificate"; quantdrift.schemas.certificate):
// 1. key_id names a trusted key (id: "ed25519:" + first 16 hex of SHA-256 of the key's 32 raw
//    bytes), and the Ed25519 signature (hex) of "quantdrift.certificate.v2\n" + payload
//    verifies under it. The payload is verified as the string it is, never re-serialised.
// 2. The embedded preflight report: base64 bytes whose SHA-256 is report_sha256, verdict "go".
// 3. Its approvals: Ed25519 signatures (hex) of "quantdrift.signoff.v2\n" + four length-
//    prefixed fields (4-byte big-endian length, then UTF-8): the report's SHA-256 (hex), the
//    signer's name, signed_at with 3 decimals, the key id. At least `required` distinct
//    names (distinct key ids with distinct_keys).
// 4. model == the report's subject.checkpoint, engine == its subject.engines.
// 5. live.sha256 == SHA-256 of live.text (when live evidence is attached).
// 6. When live.text is `quantdrift route status --json` (a list of route rows), each row
//    carries window, calibration and worst_pairs; a route with pairs has a window whose
//    start is not after its end and which ends before issued_at (300 s of clock skew
//    allowed); every calibration sha256 and worst pair's pair_sha256 is 64 lowercase hex.
//    (quantdrift.schemas.certificate_live, with the same words.)
const crypto = require("crypto");
const fs = require("fs");

const DOMAIN = Buffer.from("quantdrift.certificate.v2\n", "utf8");
const SIGNOFF_DOMAIN = Buffer.from("quantdrift.signoff.v2\n", "utf8");
const V1_REFUSED =
  "a version 1 certificate (HMAC-signed with the key ring): only a ring holder can check it " +
  "and any ring holder could have forged it; re-issue it with `quantdrift preflight " +
  "certificate` (Ed25519)";

function sha256hex(bytes) {
  return crypto.createHash("sha256").update(bytes).digest("hex");
}

// A PEM public key and its id, derived from its raw bytes (the JWK's x).
function trusted(pem) {
  const key = crypto.createPublicKey(pem);
  if (key.asymmetricKeyType !== "ed25519") throw new Error("not an Ed25519 public key");
  const raw = Buffer.from(key.export({ format: "jwk" }).x, "base64url");
  return [`ed25519:${sha256hex(raw).slice(0, 16)}`, key];
}

function signed(key, message, hex) {
  const sig = Buffer.from(String(hex), "hex");
  return sig.length === 64 && crypto.verify(null, message, key, sig);
}

function field(text) {
  const bytes = Buffer.from(text, "utf8");
  const len = Buffer.alloc(4);
  len.writeUInt32BE(bytes.length);
  return Buffer.concat([len, bytes]);
}

function approvalProblem(sha, a, keys) {
  const key = keys.get(a.key_id);
  if (key === undefined) return `${a.by}: unknown key id '${a.key_id}'`;
  if (a.report_sha256 !== sha) return `${a.by}: signed another version of the report`;
  const at = Number(a.signed_at).toFixed(3);
  const message = Buffer.concat([SIGNOFF_DOMAIN, field(sha), field(String(a.by)), field(at), field(a.key_id)]);
  return signed(key, message, a.signature) ? null : `${a.by}: bad signature`;
}

// Key order does not matter to equality: compare with sorted keys.
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v && typeof v === "object") {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`;
  }
  return JSON.stringify(v === undefined ? null : v);
}

const CLOCK_SKEW_S = 300;
const FIELDS = ["window", "calibration", "worst_pairs"];
const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const isSha = (v) => typeof v === "string" && /^[0-9a-f]{64}$/.test(v);

// Per route of a route status document: its pairs and the three fields; [] otherwise.
function liveRoutes(text) {
  let doc;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    return [];
  }
  if (!Array.isArray(doc)) return [];
  return doc
    .filter((r) => isObject(r) && "route" in r)
    .map((r) => ({
      route: String(r.route),
      pairs: Math.trunc(Number(r.pairs_seen || 0)),
      window: r.window ?? null,
      calibration: r.calibration ?? null,
      worst_pairs: r.worst_pairs ?? null,
      carried: FIELDS.filter((f) => f in r),
    }));
}

function routeProblems(row, issuedAt) {
  const where = `live evidence ${row.route}`;
  const missing = FIELDS.filter((f) => !row.carried.includes(f));
  if (missing.length) return [`${where}: carries no ${missing.join(", ")}`];
  const problems = [];
  const w = row.window;
  const isTime = (v) => typeof v === "number" && Number.isFinite(v);
  if (w === null) {
    if (row.pairs > 0) problems.push(`${where}: no time window for its ${row.pairs} pairs`);
  } else if (!(isObject(w) && isTime(w.first_pair_at) && isTime(w.last_pair_at))) {
    problems.push(`${where}: its time window is not two times`);
  } else {
    if (w.first_pair_at > w.last_pair_at) problems.push(`${where}: its time window ends before it starts`);
    if (w.last_pair_at > issuedAt + CLOCK_SKEW_S) {
      problems.push(`${where}: its time window ends after the certificate was issued`);
    }
  }
  for (const [name, key] of [["calibration", "sha256"], ["worst_pairs", "pair_sha256"]]) {
    const items = row[name];
    if (!Array.isArray(items)) {
      problems.push(`${where}: ${name} is not a list`);
      continue;
    }
    items.forEach((item, i) => {
      if (!(isObject(item) && isSha(item[key]))) problems.push(`${where}: ${name} ${i + 1}: not a SHA-256`);
    });
  }
  return problems;
}

function refused(why, keyId = "") {
  return { ok: false, key_id: keyId, signers: [], problems: [why] };
}

function verify(text, keys) {
  const env = JSON.parse(text);
  if (env.kind === "quantdrift.certificate.v1") return refused(V1_REFUSED, String(env.key_id ?? ""));
  if (env.kind !== "quantdrift.certificate.v2" || typeof env.payload !== "string") {
    return refused("not a quantdrift certificate");
  }
  const keyId = String(env.key_id);
  const key = keys.get(keyId);
  if (key === undefined) {
    return refused(`signed by ${keyId}, which is not a trusted public key (give its public key)`, keyId);
  }
  if (!signed(key, Buffer.concat([DOMAIN, Buffer.from(env.payload, "utf8")]), env.signature)) {
    return refused("bad signature: the certificate was altered or forged", keyId);
  }
  const payload = JSON.parse(env.payload);
  const pf = payload.preflight || {};
  const problems = [];
  const raw = Buffer.from(pf.report || "", "base64");
  const sha = sha256hex(raw);
  if (sha !== pf.report_sha256) problems.push("the embedded report does not match its SHA-256");
  const report = JSON.parse(raw.toString("utf8"));
  const approvals = pf.approvals || [];
  for (const a of approvals) {
    if (a.alg !== "ed25519") {
      problems.push(
        `preflight: ${a.by}: an HMAC approval (key '${a.key_id}'); a certificate needs Ed25519 approvals`,
      );
    }
  }
  if (report.verdict !== "go") problems.push(`preflight: verdict is '${report.verdict}', not 'go'`);
  const signers = new Map();
  for (const a of approvals.filter((x) => x.alg === "ed25519")) {
    const why = approvalProblem(sha, a, keys);
    if (why) problems.push(`preflight: ${why}`);
    else if (!signers.has(String(a.by))) signers.set(String(a.by), String(a.key_id));
  }
  const count = pf.distinct_keys ? new Set(signers.values()).size : signers.size;
  const required = Number(pf.required ?? 2);
  if (count < required) {
    const what = pf.distinct_keys ? "distinct keys" : "distinct signers";
    problems.push(`preflight: ${count} ${what} with a valid approval, ${required} needed`);
  }
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
  const routes = payload.live ? liveRoutes(String(payload.live.text)) : [];
  for (const row of routes) problems.push(...routeProblems(row, Number(payload.issued_at || 0)));
  const evidence = routes.map(({ carried, ...shown }) => shown);
  const ok = problems.length === 0;
  const signerNames = [...signers.keys()].sort();
  return {
    ok, key_id: keyId, signers: signerNames, problems, route: payload.route, model: payload.model, evidence,
  };
}

let result;
let keys;
try {
  keys = new Map(process.argv.slice(2).map((path) => trusted(fs.readFileSync(path, "utf8"))));
} catch (err) {
  process.stdout.write(JSON.stringify(refused(`public key: ${err.message}`)) + "\n");
  process.exit(2);
}
let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  try {
    result = verify(input, keys);
  } catch (err) {
    result = refused(`unreadable: ${err.message}`);
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(result.ok ? 0 : 1);
});
