// The shared fingerprint vectors, the same file the Go tests read, and the rules for
// JavaScript values that JSON text does not have.

import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { canonicalize, canonicalizeJSON, fingerprint, fingerprintJSON, FingerprintError, keyText } from "../src/index.js";
import { repoRoot } from "./harness.js";

interface Vector {
  name: string;
  input?: string;
  input_hex?: string;
  drop?: string[];
  canonical?: string;
  fingerprint?: string;
  invalid?: boolean;
  inexact_number?: boolean;
}

function vectorFile(): string {
  const full = join(repoRoot, "testdata", "fingerprint", "vectors.json");
  if (!existsSync(full)) throw new Error(`no fingerprint vector file at ${full}`);
  return full;
}

function inputOf(v: Vector): string | Uint8Array {
  if (v.input_hex !== undefined) {
    const hex = v.input_hex;
    return Uint8Array.from({ length: hex.length / 2 }, (_, i) => parseInt(hex.slice(2 * i, 2 * i + 2), 16));
  }
  return v.input ?? "";
}

const file = vectorFile();
const vectors: Vector[] = JSON.parse(readFileSync(file, "utf8")).vectors;

test(`shared vectors (${file.slice(repoRoot.length + 1)})`, async (t) => {
  assert.ok(vectors.length >= 40, `only ${vectors.length} vectors`);
  let valid = 0;
  let invalid = 0;
  let inexact = 0;
  for (const v of vectors) {
    await t.test(v.name, () => {
      const input = inputOf(v);
      if (v.invalid) {
        // A refused number must say what to do about it.
        const want = v.inexact_number ? /send it as a string/ : /./;
        assert.throws(() => canonicalizeJSON(input, v.drop), (e: unknown) => e instanceof FingerprintError && want.test(e.message));
        // The same text as UTF-8 bytes must be refused as well.
        if (typeof input === "string") {
          assert.throws(() => canonicalizeJSON(new TextEncoder().encode(input), v.drop), FingerprintError);
        }
        invalid++;
        if (v.inexact_number) inexact++;
        return;
      }
      assert.equal(canonicalizeJSON(input, v.drop), v.canonical);
      assert.equal(fingerprintJSON(input, v.drop), v.fingerprint);
      if (typeof input === "string") {
        assert.equal(fingerprintJSON(new TextEncoder().encode(input), v.drop), v.fingerprint);
      }
      valid++;
    });
  }
  t.diagnostic(`${valid} valid and ${invalid} invalid vectors (${inexact} refused numbers) agree`);
  assert.equal(valid + invalid, vectors.length);
});

/**
 * Where value holds a number of magnitude 2^53 or more, outside the members drop removes,
 * as FingerprintError paths ("numbers[1]", "a.b", "" for the top).
 */
function bigNumbers(value: unknown, drop: readonly string[] = []): string[] {
  const out: string[] = [];
  const walk = (v: unknown, paths: string[][], at: string): void => {
    if (typeof v === "number") {
      if (Math.abs(v) >= 2 ** 53) out.push(at);
      return;
    }
    if (typeof v !== "object" || v === null) return;
    if (Array.isArray(v)) {
      const star = paths.filter((p) => p[0] === "*");
      if (star.some((p) => p.length === 1)) return;
      v.forEach((e, i) => walk(e, star.map((p) => p.slice(1)), `${at}[${i}]`));
      return;
    }
    for (const [name, e] of Object.entries(v)) {
      const mine = paths.filter((p) => p[0] === "*" || p[0] === name);
      if (mine.some((p) => p.length === 1)) continue;
      walk(e, mine.map((p) => p.slice(1)), at === "" ? name : `${at}.${name}`);
    }
  };
  walk(value, drop.map((d) => d.split(".")), "");
  return out;
}

// On the value path (JSON.parse, then canonicalize), every valid vector gives the
// vector's exact bytes, or is refused, and then only because it holds a number of
// magnitude 2^53 or more, which a decoded double may already have rounded (the rule of
// every client: Go's OfValue and Python refuse them too); the text path keeps them as
// written. No other refusal, and no other bytes.
test("JavaScript values from the vectors: the vector's bytes, or refused for a number of 2^53 or more", (t) => {
  const same: string[] = [];
  const refused: string[] = [];
  for (const v of vectors) {
    if (v.invalid) continue;
    const input = inputOf(v);
    const text = typeof input === "string" ? input : new TextDecoder("utf-8", { fatal: true }).decode(input);
    const value: unknown = JSON.parse(text); // a valid vector is valid JSON
    const big = bigNumbers(value, v.drop);
    if (big.length === 0) {
      assert.equal(canonicalize(value, v.drop), v.canonical, v.name);
      assert.equal(fingerprint(value, v.drop), v.fingerprint, v.name);
      same.push(v.name);
      continue;
    }
    assert.throws(() => canonicalize(value, v.drop), (err: unknown) => {
      assert.ok(err instanceof FingerprintError, `${v.name}: ${String(err)}`);
      assert.match(err.message, /beyond ±\(2\^53 − 1\).*send it as a string/, v.name);
      assert.ok(big.includes(err.path), `${v.name}: refused at ${JSON.stringify(err.path)}, where no number of 2^53 or more is (${big.join(", ")})`);
      return true;
    }, v.name);
    assert.throws(() => fingerprint(value, v.drop), FingerprintError, v.name);
    refused.push(v.name);
  }
  t.diagnostic(`JSON.parse of the valid vectors: ${same.length} give the vector's bytes; ${refused.length} are refused for a number of 2^53 or more: ${refused.join("; ")}`);
  assert.ok(same.length >= 30, `only ${same.length} vectors gave the same bytes`);
  assert.ok(refused.length >= 1, "no vector exercised the refusal of 2^53 and beyond");
});

test("JavaScript values that have no exact JSON form are refused", () => {
  const refusals: Array<[string, unknown, RegExp]> = [
    ["2^53", { amount: 2 ** 53 }, /amount.*|send it as a string/],
    ["-(2^53)", [-(2 ** 53)], /send it as a string/],
    // Every double from 2^53 up is an integer, and most integers there have no double.
    ["1e21", 1e21, /send it as a string/],
    ["1.5e300", -1.5e300, /send it as a string/],
    ["BigInt", { id: 9007199254740993n }, /BigInt .*send it as a string/],
    ["NaN", { x: NaN }, /NaN is not a JSON number/],
    ["Infinity", [Infinity], /Infinity is not a JSON number/],
    ["lone surrogate value", { s: "\ud800" }, /lone surrogate/],
    ["lone surrogate name", { ["\udc00"]: 1 }, /lone surrogate/],
    ["Map", { m: new Map([["a", 1]]) }, /Map is not JSON/],
    ["Set", new Set([1]), /Set is not JSON/],
    ["Uint8Array", new Uint8Array(2), /Uint8Array is not JSON/],
    // JSON.stringify writes these as {} or through a toJSON that a plain object of the
    // same members would share.
    ["Buffer", { b: (globalThis as unknown as { Buffer: { from(s: string): Uint8Array } }).Buffer.from("ab") }, /Buffer is not JSON/],
    ["Error", { e: new Error("boom") }, /Error is not JSON/],
    ["TypeError", { e: new TypeError("other") }, /TypeError is not JSON/],
    ["boxed BigInt", { n: Object(1n) }, /BigInt is not JSON/],
    ["WeakRef", { w: new WeakRef({}) }, /WeakRef is not JSON/],
    ["function", { f: () => 1 }, /function is not JSON/],
    ["symbol", { s: Symbol("x") }, /symbol is not JSON/],
    ["top-level undefined", undefined, /undefined is not JSON/],
    // An invalid Date's toJSON is null: it had null's fingerprint, as had every other
    // invalid Date (new Date("2026-02-30x") and new Date(NaN) were one effect).
    ["invalid Date", { when: new Date("not a date") }, /invalid Date/],
    ["invalid Date in an array", [new Date(NaN)], /invalid Date/],
    ["invalid Date at the top", new Date(NaN), /invalid Date/],
  ];
  for (const [name, value, re] of refusals) {
    assert.throws(() => canonicalize(value), (err: unknown) => err instanceof FingerprintError && re.test(err.message), name);
  }
  const cyclic: Record<string, unknown> = { a: 1 };
  cyclic.self = cyclic;
  assert.throws(() => canonicalize(cyclic), /refers to itself/);
  let deep: unknown = 1;
  for (let i = 0; i < 1100; i++) deep = [deep];
  assert.throws(() => canonicalize(deep), /nested deeper than 1000/);
  // 1000 levels of arrays are accepted and 1001 refused, as the server counts them.
  const nested = (n: number): unknown => { let v: unknown = []; for (let i = 1; i < n; i++) v = [v]; return v; };
  assert.equal(canonicalize(nested(1000)).length, 2000);
  assert.throws(() => canonicalize(nested(1001)), /nested deeper than 1000/);
  assert.equal(canonicalizeJSON("[".repeat(1000) + "]".repeat(1000)).length, 2000);
  assert.throws(() => canonicalizeJSON("[".repeat(1001) + "]".repeat(1001)), /nested deeper than 1000/);
  assert.throws(() => canonicalize({ a: 1 }, ["a..b"]), /empty segment/);
});

test("JavaScript values: what is accepted, and how", () => {
  // The largest safe integers are exact; -0 is 0; undefined members are left out like
  // JSON.stringify does; toJSON is honoured; boxed primitives are their values.
  assert.equal(canonicalize([2 ** 53 - 1, -(2 ** 53 - 1), -0, 0.1, 1e-7, 1.5e-300, 123456.789]),
    "[9007199254740991,-9007199254740991,0,0.1,1e-7,1.5e-300,123456.789]");
  assert.equal(canonicalize({ b: undefined, a: new Date(Date.UTC(2026, 6, 29, 13, 0, 13)) }), '{"a":"2026-07-29T13:00:13.000Z"}');
  assert.equal(canonicalize([new String("x"), new Number(2), new Boolean(false)]), '["x",2,false]');
  // A valid Date is its ISO string, a URL its href (both toJSON): the text the value means.
  assert.equal(canonicalize([new Date(0), new URL("https://example.com/a?b=1")]), '["1970-01-01T00:00:00.000Z","https://example.com/a?b=1"]');
  // The same object twice (not a cycle) is fine.
  const shared = { k: 1 };
  assert.equal(canonicalize({ x: shared, y: shared }), '{"x":{"k":1},"y":{"k":1}}');
  // "__proto__" from JSON text is a member like any other.
  assert.equal(canonicalizeJSON('{"__proto__":{"a":1},"b":2}'), '{"__proto__":{"a":1},"b":2}');
  // The article's effect: the server and Go get these bytes (the vector file says so).
  const effect = { tenant: "tenant_42", project: "OPS", title: "Outage X: API 5xx", severity: "sev1", customer_id: "cus_9", incident_id: "inc_17" };
  assert.equal(fingerprint(effect), "sha256:76157b1f62c6c2942d526bb835ec2d1ee237f3ad3701791256e1a8e5cf57b02f");
  assert.equal(fingerprint({ ...effect, trace_id: "t1" }, ["trace_id"]), fingerprint(effect));
});

test("a key argument is written as the gateway and the Python client write it (testdata/keytext)", () => {
  const file = JSON.parse(readFileSync(join(repoRoot, "testdata", "keytext", "vectors.json"), "utf8")) as {
    cases: Array<{ json: string; key: string | null }>;
  };
  assert.ok(file.cases.length >= 15);
  for (const c of file.cases) {
    const v: unknown = JSON.parse(c.json);
    if (c.key === null) assert.throws(() => keyText(v), Error, c.json);
    else assert.equal(keyText(v), c.key, c.json);
  }
  assert.equal(keyText(12345678901234567891n), "12345678901234567891");
  assert.throws(() => keyText(2 ** 53), /send it as a string/);
  assert.throws(() => keyText(10n ** 40n), /more than 40 digits/);
  assert.throws(() => keyText(NaN), FingerprintError);
});
