// Effect fingerprints: "sha256:" + hex(sha256(JCS(effect))), where JCS is RFC 8785
// canonical JSON, byte-identical to the server's and the Go client's. The repository's
// shared vector file (testdata/fingerprint/) proves it in every language.
//
// RFC 8785 formats numbers exactly as ECMAScript's Number.prototype.toString does, so
// JavaScript is the one language where that part comes for free. What JavaScript does
// not give for free is honesty about precision: JSON.parse turns 9007199254740993 into
// 9007199254740992 without a word, and two different effects would then share a
// fingerprint (a changed request would replay the old receipt instead of conflicting).
// Hence two doors:
//
//   - canonicalize(value): a JavaScript value. Integers outside ±(2^53 − 1) are refused
//     (their digits may already be lost; send such identifiers as strings), and so are a
//     BigInt, NaN, ±Infinity, lone surrogates, and values JSON has no word for.
//   - canonicalizeJSON(text): JSON text, parsed strictly (I-JSON: no duplicate member
//     names, valid UTF-8 and UTF-16) with the number rule of the server, so text that the
//     server would refuse is refused here too.

import { createHash } from "node:crypto";

/** Every fingerprint starts with this. */
export const FINGERPRINT_PREFIX = "sha256:";

/** Nesting deeper than this is refused, as the server does: an effect is a handful of fields. */
export const MAX_DEPTH = 1000;

/** Why an effect cannot be fingerprinted. Nothing was sent anywhere. */
export class FingerprintError extends Error {
  /** Where in the effect, as a path of member names and indexes ("" for the top). */
  readonly path: string;
  constructor(message: string, path = "") {
    super(path === "" ? `idemkv: fingerprint: ${message}` : `idemkv: fingerprint: ${message} (at ${path})`);
    this.name = "FingerprintError";
    this.path = path;
  }
}

/** Any value JSON can carry. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [name: string]: JsonValue };

/** A number read from JSON text: already checked against the server's number rule. */
class TextNumber {
  constructor(readonly value: number) {}
}

type DropPaths = readonly (readonly string[])[];

function splitDrop(drop: readonly string[]): DropPaths {
  return drop.map((d) => {
    const segs = d.split(".");
    if (segs.some((s) => s === "")) {
      throw new FingerprintError(`drop path ${JSON.stringify(d)} has an empty segment`);
    }
    return segs;
  });
}

/**
 * The RFC 8785 canonical form of a JavaScript value, without the members that drop
 * names: dot-separated member names from the top, "*" for any member or array element
 * ("items.*.trace_id"). Paths that match nothing are ignored.
 *
 * Like JSON.stringify, object members whose value is undefined are left out, undefined in
 * an array is null, and toJSON is honoured (a Date becomes its ISO string). Unlike it,
 * nothing else is silently turned into something else: a Map, a Set, a function, a
 * symbol, a BigInt, an invalid Date (JSON.stringify writes null), a non-finite number or
 * a number of magnitude 2^53 or more throws a FingerprintError.
 */
export function canonicalize(value: unknown, drop: readonly string[] = []): string {
  const out: string[] = [];
  write(value, splitDrop(drop), out, "", 0, new Set());
  return out.join("");
}

/** The fingerprint of a JavaScript value (see canonicalize). */
export function fingerprint(value: unknown, drop: readonly string[] = []): string {
  return sum(canonicalize(value, drop));
}

/**
 * The RFC 8785 canonical form of JSON text (a string, or UTF-8 bytes), without the
 * members that drop names. The text must be I-JSON: one value, no duplicate member
 * names, no lone surrogates, valid UTF-8, no byte order mark, and numbers that the
 * server accepts (see checkNumber).
 */
export function canonicalizeJSON(text: string | Uint8Array, drop: readonly string[] = []): string {
  const paths = splitDrop(drop);
  const value = new Parser(decodeText(text)).parseDocument();
  const out: string[] = [];
  write(value, paths, out, "", 0, new Set());
  return out.join("");
}

/** The fingerprint of JSON text (see canonicalizeJSON). */
export function fingerprintJSON(text: string | Uint8Array, drop: readonly string[] = []): string {
  return sum(canonicalizeJSON(text, drop));
}

/** The most digits of an integer that keyText writes: an identifier, not a quantity. */
export const MAX_KEY_DIGITS = 40;

/**
 * The text a key argument names its operation by (`idempotent(fn, {key: "orderId"})`:
 * key `"<text>:<tool>"`), written as the Go gateway's key templates and the Python
 * client write it (testdata/keytext), so that equal values are one key and different
 * values two: a string as it is; `true` or `false`; an integer as its exact digits (a
 * number beyond ±(2^53 − 1) is refused, as its fingerprint is: its digits may already
 * be lost; a BigInt keeps them, at most MAX_KEY_DIGITS); any other number as RFC 8785
 * writes it ("0.5"). Anything else throws: `String()` of an object is
 * "[object Object]" for every object.
 */
export function keyText(v: unknown): string {
  switch (typeof v) {
    case "string":
      return v;
    case "boolean":
      return v ? "true" : "false";
    case "number":
      if (!Number.isFinite(v)) throw new FingerprintError(`${v} cannot name an operation`, "");
      if (Number.isInteger(v) && !Number.isSafeInteger(v)) {
        throw new FingerprintError(`number ${v} is beyond ±(2^53 − 1), where its digits may already be lost: send it as a string`, "");
      }
      return String(v); // Number::toString: RFC 8785's form; -0 is "0"
    case "bigint": {
      const text = v.toString();
      if (text.replace("-", "").length > MAX_KEY_DIGITS) {
        throw new FingerprintError(`an integer of more than ${MAX_KEY_DIGITS} digits cannot name an operation: send it as a string`, "");
      }
      return text;
    }
  }
  throw new TypeError(`${v === null ? "null" : typeof v} cannot name an operation: the key argument must be a string, a number or a boolean (or give key: (a) => ...)`);
}

/** The fingerprint of text that is already canonical. */
export function sum(canonical: string): string {
  return FINGERPRINT_PREFIX + createHash("sha256").update(canonical).digest("hex");
}

function pathOf(parent: string, name: string | number): string {
  if (typeof name === "number") return `${parent}[${name}]`;
  return parent === "" ? name : `${parent}.${name}`;
}

function isWellFormed(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff) {
      const d = s.charCodeAt(i + 1);
      if (!(d >= 0xdc00 && d <= 0xdfff)) return false;
      i++;
    } else if (c >= 0xdc00 && c <= 0xdfff) {
      return false;
    }
  }
  return true;
}

function writeString(s: string, out: string[], path: string): void {
  if (!isWellFormed(s)) {
    throw new FingerprintError("string has a lone surrogate (not valid Unicode)", path);
  }
  // For well-formed strings JSON.stringify escapes exactly what RFC 8785 section
  // 3.2.2.2 asks: '"', '\\', the short forms \b \f \n \r \t, other controls below
  // U+0020 as lower-case \u00xx, and nothing else.
  out.push(JSON.stringify(s));
}

function writeNumber(n: number, out: string[], path: string, fromText: boolean): void {
  if (!Number.isFinite(n)) {
    throw new FingerprintError(`${n} is not a JSON number`, path);
  }
  if (!fromText && Number.isInteger(n) && !Number.isSafeInteger(n)) {
    throw new FingerprintError(
      `number ${n} is beyond ±(2^53 − 1), where doubles hold only some integers: its digits may ` +
        "already be lost and two different effects could share a fingerprint; send it as a string",
      path,
    );
  }
  // Number::toString is what RFC 8785 section 3.2.2.3 specifies; -0 prints as "0".
  out.push(String(n));
}

/**
 * Objects that JSON.stringify writes as {} or as something else (an Error as {}, so
 * that two errors share a fingerprint; a Buffer through its toJSON as a plain object;
 * a boxed BigInt or Symbol as {}): refused, as Python refuses bytes and sets.
 */
function notJSON(obj: object): boolean {
  return obj instanceof Map || obj instanceof Set || obj instanceof WeakMap || obj instanceof WeakSet ||
    ArrayBuffer.isView(obj) || obj instanceof ArrayBuffer || obj instanceof SharedArrayBuffer ||
    obj instanceof RegExp || obj instanceof Promise || obj instanceof Error || obj instanceof WeakRef ||
    obj instanceof BigInt || obj instanceof Symbol;
}

/** Whether obj is a Date (of any realm) that holds no time. */
function invalidDate(obj: object): boolean {
  let t: number;
  try {
    t = Date.prototype.getTime.call(obj as Date);
  } catch {
    return false; // not a Date
  }
  return Number.isNaN(t);
}

function write(v: unknown, drop: DropPaths, out: string[], path: string, depth: number, seen: Set<object>): void {
  switch (typeof v) {
    case "string":
      writeString(v, out, path);
      return;
    case "number":
      writeNumber(v, out, path, false);
      return;
    case "boolean":
      out.push(v ? "true" : "false");
      return;
    case "bigint":
      throw new FingerprintError(
        `BigInt ${v}n has no exact JSON number: send it as a string (String(x)), the fingerprint then keeps every digit`,
        path,
      );
    case "undefined":
    case "function":
    case "symbol":
      throw new FingerprintError(`a ${typeof v} is not JSON`, path);
  }
  if (v === null) {
    out.push("null");
    return;
  }
  if (v instanceof TextNumber) {
    writeNumber(v.value, out, path, true);
    return;
  }
  const obj = v as object;
  // Before toJSON: a Buffer's toJSON makes {"type":"Buffer","data":[...]}, which a
  // plain object of those members would share.
  if (notJSON(obj)) {
    throw new FingerprintError(`a ${obj.constructor?.name ?? "value"} is not JSON (JSON.stringify would write {} or lose it)`, path);
  }
  // An invalid Date's toJSON is null: null's fingerprint, and every invalid Date's.
  if (invalidDate(obj)) {
    throw new FingerprintError("an invalid Date is not JSON (JSON.stringify would write null)", path);
  }
  if (typeof (obj as { toJSON?: unknown }).toJSON === "function") {
    write((obj as { toJSON(): unknown }).toJSON(), drop, out, path, depth, seen);
    return;
  }
  if (obj instanceof Number || obj instanceof String || obj instanceof Boolean) {
    write(obj.valueOf(), drop, out, path, depth, seen);
    return;
  }
  // An object or array at depth d is the (d+1)th level, as the server counts them.
  if (depth >= MAX_DEPTH) throw new FingerprintError(`nested deeper than ${MAX_DEPTH}`, path);
  if (seen.has(obj)) throw new FingerprintError("the value refers to itself", path);
  seen.add(obj);
  if (Array.isArray(obj)) {
    writeArray(obj, drop, out, path, depth, seen);
  } else {
    writeObject(obj as Record<string, unknown>, drop, out, path, depth, seen);
  }
  seen.delete(obj);
}

function writeArray(a: unknown[], drop: DropPaths, out: string[], path: string, depth: number, seen: Set<object>): void {
  // Only "*" names array elements; a "*" that ends a path removes them all.
  const star = drop.filter((p) => p[0] === "*");
  if (star.some((p) => p.length === 1)) {
    out.push("[]");
    return;
  }
  const below = star.map((p) => p.slice(1));
  out.push("[");
  for (let i = 0; i < a.length; i++) {
    if (i > 0) out.push(",");
    const e = a[i];
    // As JSON.stringify writes it: frameworks pass undefined for a field the model left out.
    write(e === undefined ? null : e, below, out, pathOf(path, i), depth + 1, seen);
  }
  out.push("]");
}

function writeObject(o: Record<string, unknown>, drop: DropPaths, out: string[], path: string, depth: number, seen: Set<object>): void {
  // Sorting by UTF-16 code units (RFC 8785 section 3.2.3) is what the default string
  // comparison of Array.prototype.sort does.
  const names = Object.keys(o).sort();
  out.push("{");
  let first = true;
  for (const name of names) {
    const val = o[name];
    if (val === undefined) continue;
    const mine = drop.filter((p) => p[0] === "*" || p[0] === name);
    if (mine.some((p) => p.length === 1)) continue;
    if (!isWellFormed(name)) {
      throw new FingerprintError("member name has a lone surrogate (not valid Unicode)", pathOf(path, name));
    }
    if (!first) out.push(",");
    first = false;
    out.push(JSON.stringify(name), ":");
    write(val, mine.map((p) => p.slice(1)), out, pathOf(path, name), depth + 1, seen);
  }
  out.push("}");
}

// ---- JSON text ----

function decodeText(text: string | Uint8Array): string {
  if (typeof text === "string") {
    if (!isWellFormed(text)) throw new FingerprintError("text has a lone surrogate (not valid Unicode)");
    return text;
  }
  try {
    // fatal: invalid UTF-8, overlong forms and encoded surrogates throw. ignoreBOM keeps
    // a byte order mark in the text, where the parser refuses it as the server does.
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(text);
  } catch {
    throw new FingerprintError("text is not valid UTF-8");
  }
}

// checkNumber is the rule every implementation applies to numbers in JSON text
// (testdata/fingerprint/README.md): the literal must be within the range of a double,
// and the shortest form JCS writes for that double must denote the literal's own decimal
// value. 9007199254740993 (written 9007199254740992), 1e-400 (written 0) and
// 333333333.33333329 (written 333333333.3333333) are refused; 1E30, 4.50 and 0.1 are not.
function checkNumber(lexeme: string, n: number, at: number): void {
  if (!Number.isFinite(n)) {
    throw new FingerprintError(`number ${lexeme} at character ${at} is beyond the range of a double`);
  }
  if (decimalValue(lexeme) !== decimalValue(String(n))) {
    throw new FingerprintError(
      `number ${lexeme} at character ${at} has no exact double (JCS would write ${String(n)}); ` +
        "two different effects could share a fingerprint: send it as a string");
  }
}

/** A number's decimal value as "sign digits e exponent", digits without leading or trailing zeros; zero is "0". */
function decimalValue(text: string): string {
  const m = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([-+]?\d+))?$/.exec(text);
  if (m === null) return text; // never: both sides are valid JSON numbers
  const frac = m[3] ?? "";
  let digits = (m[2] + frac).replace(/^0+/, "");
  if (digits === "") return "0";
  let exp = BigInt(m[4] ?? "0") - BigInt(frac.length);
  const trimmed = digits.replace(/0+$/, "");
  exp += BigInt(digits.length - trimmed.length);
  digits = trimmed;
  return `${m[1]}${digits}e${exp}`;
}

// The number grammar of RFC 8259, anchored where the parser stands (sticky).
const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?/y;

const WS = new Set([0x20, 0x09, 0x0a, 0x0d]);

class Parser {
  private i = 0;
  constructor(private readonly s: string) {}

  parseDocument(): unknown {
    this.ws();
    const v = this.value(0);
    this.ws();
    if (this.i !== this.s.length) this.fail("text after the value");
    return v;
  }

  private fail(msg: string): never {
    throw new FingerprintError(`invalid JSON at character ${this.i}: ${msg}`);
  }

  private ws(): void {
    while (this.i < this.s.length && WS.has(this.s.charCodeAt(this.i))) this.i++;
  }

  private value(depth: number): unknown {
    const c = this.s[this.i];
    // An object or array at depth d is the (d+1)th level, as the server counts them.
    if ((c === "{" || c === "[") && depth >= MAX_DEPTH) this.fail(`nested deeper than ${MAX_DEPTH}`);
    switch (c) {
      case "{":
        return this.object(depth);
      case "[":
        return this.array(depth);
      case '"':
        return this.string();
      case "t":
        return this.literal("true", true);
      case "f":
        return this.literal("false", false);
      case "n":
        return this.literal("null", null);
      case undefined:
        return this.fail("unexpected end of text");
    }
    if (c === "-" || (c >= "0" && c <= "9")) return this.number();
    return this.fail(`unexpected ${JSON.stringify(c)}`);
  }

  private literal(word: string, v: unknown): unknown {
    if (this.s.startsWith(word, this.i)) {
      this.i += word.length;
      return v;
    }
    return this.fail(`expected ${word}`);
  }

  private object(depth: number): Record<string, unknown> {
    // No prototype, so that a member named "__proto__" is a member like any other.
    const o: Record<string, unknown> = Object.create(null);
    this.i++;
    this.ws();
    if (this.s[this.i] === "}") {
      this.i++;
      return o;
    }
    for (;;) {
      this.ws();
      if (this.s[this.i] !== '"') this.fail("expected a member name");
      const name = this.string();
      if (Object.prototype.hasOwnProperty.call(o, name)) this.fail(`duplicate member name ${JSON.stringify(name)}`);
      this.ws();
      if (this.s[this.i] !== ":") this.fail("expected ':'");
      this.i++;
      this.ws();
      o[name] = this.value(depth + 1);
      this.ws();
      const c = this.s[this.i++];
      if (c === "}") return o;
      if (c !== ",") this.fail("expected ',' or '}'");
    }
  }

  private array(depth: number): unknown[] {
    const a: unknown[] = [];
    this.i++;
    this.ws();
    if (this.s[this.i] === "]") {
      this.i++;
      return a;
    }
    for (;;) {
      this.ws();
      a.push(this.value(depth + 1));
      this.ws();
      const c = this.s[this.i++];
      if (c === "]") return a;
      if (c !== ",") this.fail("expected ',' or ']'");
    }
  }

  private string(): string {
    this.i++; // the opening quote
    let out = "";
    let run = this.i;
    for (;;) {
      if (this.i >= this.s.length) this.fail("unterminated string");
      const c = this.s.charCodeAt(this.i);
      if (c === 0x22) {
        out += this.s.slice(run, this.i);
        this.i++;
        break;
      }
      if (c < 0x20) this.fail("raw control character in a string");
      if (c !== 0x5c) {
        this.i++;
        continue;
      }
      out += this.s.slice(run, this.i);
      const e = this.s[this.i + 1];
      this.i += 2;
      switch (e) {
        case '"': out += '"'; break;
        case "\\": out += "\\"; break;
        case "/": out += "/"; break;
        case "b": out += "\b"; break;
        case "f": out += "\f"; break;
        case "n": out += "\n"; break;
        case "r": out += "\r"; break;
        case "t": out += "\t"; break;
        case "u": {
          const hex = this.s.slice(this.i, this.i + 4);
          if (!/^[0-9a-fA-F]{4}$/.test(hex)) this.fail("\\u needs four hex digits");
          out += String.fromCharCode(parseInt(hex, 16));
          this.i += 4;
          break;
        }
        default:
          this.i -= 2;
          this.fail(`invalid escape \\${e ?? ""}`);
      }
      run = this.i;
    }
    // Escapes can spell lone or reversed surrogates; raw text was checked on entry.
    if (!isWellFormed(out)) this.fail("string has a lone surrogate (not valid Unicode)");
    return out;
  }

  private number(): TextNumber {
    NUMBER.lastIndex = this.i;
    const m = NUMBER.exec(this.s);
    if (m === null) return this.fail("invalid number");
    const lexeme = m[0];
    const next = this.s[this.i + lexeme.length];
    if (next !== undefined && /[0-9.eE+-]/.test(next)) this.fail(`invalid number ${JSON.stringify(lexeme + next)}`);
    const n = Number(lexeme);
    checkNumber(lexeme, n, this.i);
    this.i += lexeme.length;
    return new TextNumber(n);
  }
}
