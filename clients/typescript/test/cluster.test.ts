// A three-node cluster of real idemkv processes: leader discovery through the
// Idemkv-Leader header, and a leader SIGKILLed while the tool runs.

import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { Client, idempotent, type Outcome } from "../src/index.js";
import { killAll, startCluster, type IdemkvNode } from "./harness.js";

const TENANT = "tenant_ts";
let nodes: IdemkvNode[];

before(async () => {
  nodes = await startCluster();
}, { timeout: 90_000 });
after(killAll);

function nodeAt(base: string): IdemkvNode {
  const n = nodes.find((x) => base.endsWith("//" + x.httpAddr));
  assert.ok(n, `no node at ${base}`);
  return n;
}

describe("three-node cluster", () => {
  it("finds the leader through any node", async (t) => {
    const seen = await new Client({ endpoints: [nodes[0].httpAddr] }).cluster();
    const follower = seen.nodes.find((n) => n.api_addr !== seen.leader.api_addr);
    assert.ok(follower);
    const c = new Client({ endpoints: [follower.api_addr] });
    const info = await c.cluster();
    assert.equal(info.nodes.length, 3);
    // Every member of this build reads data format 3, so the cluster's is 3.
    assert.equal(info.format, 3);
    assert.deepEqual(info.nodes.map((n) => n.format), [3, 3, 3]);
    assert.equal(typeof info.clock?.anchored, "boolean");
    await c.list(TENANT);
    assert.equal(c.leader, `http://${info.leader.api_addr}`);
    assert.notEqual(c.leader, `http://${follower.api_addr}`);
    t.diagnostic(`asked ${follower.api_addr}; leader is ${c.leader}`);
  });

  it("the leader killed mid-call still yields one effect", async (t) => {
    const client = new Client({ endpoints: nodes.map((n) => n.httpAddr), leaseTtl: 2000, storeWait: 30_000 });
    let effects = 0;
    let killed = "";
    const createTicket = async (a: { key: string; title: string }) => {
      effects++;
      // The tool has run (the ticket exists); now the leader that granted the lease dies
      // before the receipt is stored.
      const leader = (await client.cluster()).leader.api_addr;
      killed = leader;
      await nodeAt("http://" + leader).kill();
      return { id: `TCK-${effects}`, title: a.title };
    };
    const outs: Outcome[] = [];
    const create = idempotent(createTicket, {
      client, tenant: TENANT, tool: "create_ticket", key: (a) => a.key, effect: (a) => ({ title: a.title }),
      receipt: (x) => ({ remoteSystem: "tickets", remoteId: x.id }), onOutcome: (o) => outs.push(o),
    });
    const key = `ts:leader-kill:${Date.now()}`;
    const start = Date.now();
    const got = await create({ key, title: "Outage X" });
    const ms = Date.now() - start;
    assert.equal(got.id, "TCK-1");
    assert.equal(effects, 1);
    assert.equal(outs[0].decision, "execute");

    // Every retry, through whichever nodes are left, replays the one receipt.
    const again = await create({ key, title: "Outage X" });
    assert.equal(again.id, "TCK-1");
    assert.equal(effects, 1);
    assert.equal(outs[1].replayed, true);
    const newLeader = (await client.cluster()).leader.api_addr;
    assert.notEqual(newLeader, killed);
    t.diagnostic(`killed leader ${killed} while the tool ran; receipt ${got.id} stored in ${ms} ms via ${newLeader}; ` +
      `retry: decision=${outs[1].decision}; tool ran ${effects} time(s)`);
  });
});
