// The types of @opentelemetry/api 1.x that a program hands the client: Tracer, Span and
// what they name, with the signatures that package declares (api/src/trace/ and
// api/src/common/ of opentelemetry-js, read for this). There is no npm registry here,
// so they are declared, and only as types: tracing.test.ts imports them with `import
// type`, which leaves nothing at run time. Its recording tracer implements this
// Tracer, so that compiling the test proves that such a tracer is a ClientOptions.tracer.

declare module "@opentelemetry/api" {
  export interface Context {
    getValue(key: symbol): unknown;
    setValue(key: symbol, value: unknown): Context;
    deleteValue(key: symbol): Context;
  }

  export type AttributeValue = string | number | boolean | Uint8Array | Array<AttributeValue> | { [key: string]: AttributeValue } | null | undefined;
  export interface Attributes {
    [attributeKey: string]: AttributeValue | undefined;
  }
  export type SpanAttributes = Attributes;
  export type SpanAttributeValue = AttributeValue;

  export type HrTime = [number, number];
  export type TimeInput = HrTime | number | Date;

  export enum SpanKind {
    INTERNAL = 0,
    SERVER = 1,
    CLIENT = 2,
    PRODUCER = 3,
    CONSUMER = 4,
  }

  export enum SpanStatusCode {
    UNSET = 0,
    OK = 1,
    ERROR = 2,
  }

  export interface SpanStatus {
    code: SpanStatusCode;
    message?: string;
  }

  export interface TraceState {
    set(key: string, value: string): TraceState;
    unset(key: string): TraceState;
    get(key: string): string | undefined;
    serialize(): string;
  }

  export interface SpanContext {
    traceId: string;
    spanId: string;
    isRemote?: boolean;
    traceFlags: number;
    traceState?: TraceState;
  }

  export interface Link {
    context: SpanContext;
    attributes?: SpanAttributes;
    droppedAttributesCount?: number;
  }

  export type Exception =
    | { code: string | number; name?: string; message?: string; stack?: string }
    | { code?: string | number; message: string; name?: string; stack?: string }
    | { code?: string | number; message?: string; name: string; stack?: string }
    | string;

  export interface SpanOptions {
    kind?: SpanKind;
    attributes?: SpanAttributes;
    links?: Link[];
    startTime?: TimeInput;
    root?: boolean;
  }

  export interface Span {
    spanContext(): SpanContext;
    setAttribute(key: string, value: SpanAttributeValue): this;
    setAttributes(attributes: SpanAttributes): this;
    addEvent(name: string, attributesOrStartTime?: SpanAttributes | TimeInput, startTime?: TimeInput): this;
    addLink(link: Link): this;
    addLinks(links: Link[]): this;
    setStatus(status: SpanStatus): this;
    updateName(name: string): this;
    end(endTime?: TimeInput): void;
    isRecording(): boolean;
    recordException(exception: Exception, time?: TimeInput): void;
  }

  export interface Tracer {
    startSpan(name: string, options?: SpanOptions, context?: Context): Span;
    startActiveSpan<F extends (span: Span) => unknown>(name: string, fn: F): ReturnType<F>;
    startActiveSpan<F extends (span: Span) => unknown>(name: string, options: SpanOptions, fn: F): ReturnType<F>;
    startActiveSpan<F extends (span: Span) => unknown>(name: string, options: SpanOptions, context: Context, fn: F): ReturnType<F>;
  }
}
