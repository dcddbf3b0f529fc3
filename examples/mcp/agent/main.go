// Command agent plays an agent that retries: it sends the same create_ticket call to
// the idemkv MCP gateway twice, as a runtime would after a timeout, and shows that the
// second call is a replay of the first, not a second ticket.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	url := flag.String("gateway", "http://127.0.0.1:7430/mcp", "the gateway's streamable HTTP endpoint")
	incident := flag.String("incident", "INC-1", "incident to open a ticket for")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "example-agent", Version: "1"}, nil)
	sess, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: *url}, nil)
	if err != nil {
		log.Fatalf("connecting to %s: %v", *url, err)
	}
	defer sess.Close()

	for attempt, trace := range []string{"trace-1", "trace-2"} {
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{
			Name: "create_ticket",
			Arguments: map[string]any{
				"incident_id": *incident, "title": "database is down", "severity": "high", "trace_id": trace,
			},
		})
		if err != nil {
			log.Fatalf("create_ticket: %v", err)
		}
		fmt.Printf("attempt %d: decision=%v isError=%v\n", attempt+1, res.Meta["io.idemkv/decision"], res.IsError)
		if res.IsError {
			// The gateway's own errors say why in _meta and in words.
			fmt.Printf("  error=%v\n", res.Meta["io.idemkv/error"])
			for _, c := range res.Content {
				if t, ok := c.(*mcp.TextContent); ok {
					fmt.Println("  " + t.Text)
				}
			}
			continue
		}
		show(res.StructuredContent)
	}

	// add_comment has no key of any kind: the policy derives one (key: derive), so
	// re-issuing the same comment, as a client whose stream broke must, is a replay.
	if ticket, ok := ticketID(ctx, sess, *incident); ok {
		for attempt := range 2 {
			res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "add_comment",
				Arguments: map[string]any{"ticket_id": ticket, "text": "paging the on-call DBA"}})
			if err != nil {
				log.Fatalf("add_comment: %v", err)
			}
			fmt.Printf("add_comment attempt %d: decision=%v key=%v\n", attempt+1, res.Meta["io.idemkv/decision"], res.Meta["io.idemkv/idempotency_key"])
		}
	}

	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "list_tickets"})
	if err != nil {
		log.Fatalf("list_tickets: %v", err)
	}
	fmt.Println("list_tickets (read-only, passed straight through):")
	show(res.StructuredContent)
}

// ticketID finds the incident's ticket with the read-only find_ticket.
func ticketID(ctx context.Context, sess *mcp.ClientSession, incident string) (string, bool) {
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "find_ticket", Arguments: map[string]any{"incident_id": incident}})
	if err != nil || res.IsError {
		return "", false
	}
	m, _ := res.StructuredContent.(map[string]any)
	t, _ := m["ticket"].(map[string]any)
	id, ok := t["ticket_id"].(string)
	return id, ok
}

func show(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("  ", "  ")
	fmt.Print("  ")
	_ = enc.Encode(v)
}
