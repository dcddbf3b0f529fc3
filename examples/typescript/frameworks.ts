// Recipes: idemkv under the tools of the Vercel AI SDK and Mastra, with the key from the
// framework's run and tool-call ids.
//
// The frameworks cannot be installed here (no npm registry), so each recipe is written
// against the structural contract it relies on, which the stand-ins below reproduce and
// this program exercises. With the real framework, import its tool()/createTool() and
// delete the stand-in; the recipe does not change. The contract, per framework:
//
//   Vercel AI SDK (`tool` from "ai"): execute(args, options) gets the model's arguments
//   and { toolCallId, messages, abortSignal }. A step replayed after a crash (your
//   runtime re-sending the same assistant message) carries the same toolCallId.
//
//   Mastra (`createTool` from "@mastra/core/tools"): execute({ context, runId, ... },
//   options) gets the arguments as context, the workflow or agent run id, and the AI
//   SDK's options with toolCallId. A workflow resumed from its snapshot re-runs the
//   suspended step with the same runId.
//
// The recipe in both: the framework's tool outside, operation(`${run}:${toolCallId}`, ...)
// around the call, and the idempotent() function inside, taking only the business
// arguments (so the effect is exactly them: no messages, no signal, no ids).
//
//   node dist/examples/typescript/frameworks.js [--endpoint 127.0.0.1:7420]

import { Client, idempotent, operation } from "../../clients/typescript/src/index.js";

interface TicketArgs {
  title: string;
  severity?: string;
}
interface Ticket {
  id: string;
  title: string;
  severity: string;
}

const tickets: Ticket[] = []; // the downstream system's effects

// ---- the stand-ins: only what the recipes rely on ----

/** The AI SDK's tool(): a description, a schema, and execute(args, { toolCallId, abortSignal }). */
function aiSdkTool<A, R>(t: { description: string; execute: (args: A, options: { toolCallId: string; messages: unknown[]; abortSignal?: AbortSignal }) => Promise<R> }) {
  return t;
}

/** Mastra's createTool(): an id, and execute({ context, runId }, { toolCallId }). */
function mastraCreateTool<A, R>(t: { id: string; execute: (input: { context: A; runId?: string }, options: { toolCallId: string }) => Promise<R> }) {
  return t;
}

async function main(): Promise<void> {
  const i = process.argv.indexOf("--endpoint");
  const client = new Client({ endpoints: [i > 0 ? process.argv[i + 1] : "127.0.0.1:7420"] });

  // The business tool, once, with the optional severity the model may leave out.
  const createTicket = idempotent(async (a: TicketArgs): Promise<Ticket> => {
    const t = { id: `LIN-${tickets.length + 1}`, title: a.title, severity: a.severity ?? "sev3" };
    tickets.push(t);
    return t;
  }, {
    client, tenant: "acme", tool: "create_ticket",
    receipt: (t) => ({ remoteSystem: "linear", remoteId: t.id }),
    probe: async (a) => tickets.find((t) => t.title === a.title) ?? null,
  });

  const run = Math.random().toString(16).slice(2, 10);

  const openTicket = aiSdkTool({
    description: "Open a ticket",
    execute: (args: TicketArgs, { toolCallId }) => operation(`chat_${run}:${toolCallId}`, () => createTicket(args)),
  });
  // The model left severity out: the SDK passes it as undefined.
  const first = await openTicket.execute({ title: `Outage ${run}`, severity: undefined }, { toolCallId: "call_1", messages: [] });
  const replayed = await openTicket.execute({ title: `Outage ${run}` }, { toolCallId: "call_1", messages: [] });
  console.log(`ai sdk: ${first.id} then, replaying the step, ${replayed.id} (tickets ${tickets.length})`);

  const mastraTicket = mastraCreateTool({
    id: "open-ticket",
    execute: ({ context, runId }: { context: TicketArgs; runId?: string }, { toolCallId }) =>
      operation(`${runId ?? "no-run"}:${toolCallId}`, () => createTicket(context)),
  });
  const a = await mastraTicket.execute({ context: { title: `Disk full ${run}`, severity: "sev2" }, runId: `wf_${run}` }, { toolCallId: "call_7" });
  const b = await mastraTicket.execute({ context: { title: `Disk full ${run}`, severity: "sev2" }, runId: `wf_${run}` }, { toolCallId: "call_7" });
  console.log(`mastra: ${a.id}, resumed ${b.id} (tickets ${tickets.length})`);
  console.log(`tickets created: ${tickets.length} for 2 tool calls`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
