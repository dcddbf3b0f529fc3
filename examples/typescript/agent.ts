// An agent runtime's ticket tool, made safe to retry with idemkv.
//
// Agent frameworks (the Vercel AI SDK, Mastra, LangGraph.js ...) describe a tool as a
// name, a description, a JSON schema for its arguments and an execute function; the
// model picks the arguments, the runtime calls execute, and retries it when anything
// fails. Here the tool is a plain object of that shape, no framework needed, and the
// one line that matters is the idempotent(...) wrap of createTicket.
//
// The ticket API is a fake that sometimes times out *after* creating the ticket, the
// way real APIs do. The program plays four things a runtime sees in production:
//   1. a call whose response is lost: the retry recovers through the probe;
//   2. the same call redelivered: replayed, the API is not called;
//   3. a confused planner reusing the approval's key with another title: conflict;
//   4. two workers handed the same approval at once: one ticket.
// and then prints how many tickets the API created: one per approval.
//
//   node dist/examples/typescript/agent.js [--endpoint 127.0.0.1:7420]
//
// In your own code, import from "idemkv" instead of the relative path.

import { Client, ConflictError, idempotent, IdemkvError, type Outcome } from "../../clients/typescript/src/index.js";

// ---- the downstream ticket API (a fake) ----

interface Ticket {
  id: string;
  url: string;
  title: string;
  externalId: string;
}

class TicketAPI {
  readonly tickets: Ticket[] = [];
  /** Calls whose answer is lost after the ticket was created. */
  loseAnswers = 0;

  async create(project: string, title: string, externalId: string): Promise<Ticket> {
    await new Promise((r) => setTimeout(r, 50));
    const t = { id: `${project}-${1840 + this.tickets.length}`, url: "", title, externalId };
    t.url = `https://tickets.example/issue/${t.id}`;
    this.tickets.push(t);
    if (this.loseAnswers > 0) {
      this.loseAnswers--;
      throw new Error("ETIMEDOUT: the ticket API did not answer in 10 s");
    }
    return t;
  }

  /** Looks a ticket up by the external id we set on it. */
  async findByExternalId(externalId: string): Promise<Ticket | null> {
    return this.tickets.find((t) => t.externalId === externalId) ?? null;
  }
}

// ---- the tool, as an agent framework would declare it ----

interface CreateTicketArgs {
  conversationId: string;
  approvalId: string;
  project: string;
  title: string;
  severity: "sev1" | "sev2" | "sev3";
  traceId?: string; // volatile: not part of the effect
}

function ticketTool(client: Client, api: TicketAPI) {
  const externalId = (a: CreateTicketArgs) => `${a.conversationId}:${a.approvalId}`;
  const createTicket = (a: CreateTicketArgs) => api.create(a.project, a.title, externalId(a));

  // The one-line wrap.
  const execute = idempotent(createTicket, { client, tenant: "tenant_42", tool: "create_ticket", key: (a) => `${externalId(a)}:create_ticket`, drop: ["traceId"], receipt: (t) => ({ remoteSystem: "tickets", remoteId: t.id, remoteUrl: t.url }), probe: (a) => api.findByExternalId(externalId(a)), onOutcome: report });

  return {
    name: "create_ticket",
    description: "Create an incident ticket for an approved operation.",
    parameters: {
      type: "object",
      properties: {
        conversationId: { type: "string" }, approvalId: { type: "string" }, project: { type: "string" },
        title: { type: "string" }, severity: { enum: ["sev1", "sev2", "sev3"] }, traceId: { type: "string" },
      },
      required: ["conversationId", "approvalId", "project", "title", "severity"],
    },
    execute,
  };
}

function report(o: Outcome): void {
  const how = o.replayed ? "replayed, the API was not called" : o.probed ? "found by the probe, stored" : "created";
  console.log(`  decision=${o.decision} fence=${o.fence} attempts=${o.attempts} -> ${o.receipt.remote_id} (${how})`);
}

/** What a runtime does with a tool error: retry what may be retried, tell the model the rest. */
async function callWithRetries(tool: ReturnType<typeof ticketTool>, args: CreateTicketArgs): Promise<void> {
  for (let attempt = 1; attempt <= 5; attempt++) {
    try {
      const t = await tool.execute(args);
      console.log(`  tool answered ${t.id} ${t.url}`);
      return;
    } catch (err) {
      if (!(err instanceof IdemkvError)) throw err;
      console.log(`  attempt ${attempt}: ${err.kind}: ${err.message}`);
      if (err.kind !== "outcome_unknown" && err.kind !== "store_unavailable") return; // the model hears about it
      await new Promise((r) => setTimeout(r, 1200)); // the lease (1 s) runs out, then the retry recovers
    }
  }
}

async function main(): Promise<void> {
  const i = process.argv.indexOf("--endpoint");
  const endpoint = i > 0 ? process.argv[i + 1] : process.env.IDEMKV_ENDPOINT ?? "127.0.0.1:7420";
  const client = new Client({ endpoints: [endpoint], leaseTtl: 1000 });
  const api = new TicketAPI();
  const tool = ticketTool(client, api);
  const run = Date.now().toString(36); // a fresh conversation per run of the example
  const approval = (id: string, title = "Outage X: API 5xx"): CreateTicketArgs => ({
    conversationId: `conversation_${run}`, approvalId: id, project: "OPS", title, severity: "sev1",
    traceId: Math.random().toString(16).slice(2),
  });

  console.log("1. the ticket API times out after creating the ticket; the runtime retries");
  api.loseAnswers = 1;
  await callWithRetries(tool, approval("approval_17"));

  console.log("2. the queue redelivers the same approval");
  await callWithRetries(tool, approval("approval_17"));

  console.log("3. the planner reuses approval_17's key for another ticket");
  try {
    await tool.execute(approval("approval_17", "Something else"));
  } catch (err) {
    if (!(err instanceof ConflictError)) throw err;
    console.log(`  conflict: ${err.conflict?.reason}, existing ticket ${err.conflict?.existing_remote_id}`);
  }

  console.log("4. two workers get approval_18 at the same moment");
  const [a, b] = await Promise.all([tool.execute(approval("approval_18")), tool.execute(approval("approval_18"))]);
  console.log(`  worker A got ${a.id}, worker B got ${b.id}`);

  console.log(`tickets created by the API: ${api.tickets.length} for 2 approvals (${api.tickets.map((t) => t.id).join(", ")})`);
  if (api.tickets.length !== 2) process.exitCode = 1;
}

await main();
