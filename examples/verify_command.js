// Verify a quantdrift RouteCommand in Node.js, the way any non-Python gateway does.
//
//   node examples/verify_command.js KEYS_JSON < envelope.json
//
// KEYS_JSON maps key ids to keys of 32+ bytes, e.g. '{"k1": "<openssl rand -hex 32>"}'. The control topic's
// record value (and the route's Redis key) is a SignedCommand envelope:
//   {"schema_version": 1, "key_id": "k1", "signature": "<hex>", "payload": "<command JSON>"}
// The signature is HMAC-SHA256 over the payload string's UTF-8 bytes: verify those
// bytes, never a re-serialisation (JavaScript writes 60.0 as 60). Only then parse
// the payload. Prints the command as JSON and exits 0, or prints why and exits 1.
const crypto = require("crypto");

function verify(envelopeText, keys) {
  const envelope = JSON.parse(envelopeText);
  const key = keys[envelope.key_id];
  if (key === undefined) throw new Error(`unknown key id ${envelope.key_id}`);
  const expected = crypto
    .createHmac("sha256", key)
    .update(Buffer.from(envelope.payload, "utf8"))
    .digest();
  const given = Buffer.from(envelope.signature, "hex");
  if (given.length !== expected.length || !crypto.timingSafeEqual(given, expected)) {
    throw new Error("signature does not match");
  }
  return JSON.parse(envelope.payload);
}

const keys = JSON.parse(process.argv[2] || "{}");
let input = "";
process.stdin.on("data", (chunk) => (input += chunk));
process.stdin.on("end", () => {
  try {
    process.stdout.write(JSON.stringify(verify(input, keys)) + "\n");
  } catch (err) {
    process.stdout.write(`refused: ${err.message}\n`);
    process.exit(1);
  }
});
