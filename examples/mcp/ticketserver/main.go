// Command ticketserver is a tiny MCP server that stands in for a real ticket system in
// the idemkv mcp-gateway example and tests. Its create_ticket tool is deliberately not
// idempotent: every call opens a new ticket, which is exactly what a retried tools/call
// must not do twice.
//
// Tickets live in a JSON file (--state), written atomically before a call answers, so
// that a restarted server still knows them and find_ticket can look an effect up after
// a crash. --crash-after-create makes the process die right after it stored a ticket
// and before it answers, the failure the gateway's recovery exists for.
//
// It speaks MCP over stdio, or over streamable HTTP with --listen.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	state := flag.String("state", "tickets.json", "file that holds the tickets")
	crashFile := flag.String("crash-after-create", "", "when this file exists, create_ticket removes it, stores the ticket and kills the process before answering")
	delay := flag.Duration("delay", 0, "how long create_ticket takes (widens the window for concurrent retries)")
	listen := flag.String("listen", "", "serve streamable HTTP on this address (path /mcp) instead of stdio")
	flag.Parse()
	log.SetOutput(os.Stderr) // stdout carries MCP in stdio mode
	log.SetPrefix("ticketserver: ")

	store, err := openStore(*state)
	if err != nil {
		log.Fatal(err)
	}
	srv := newServer(store, *crashFile, *delay)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *listen == "" {
		if err := srv.Run(ctx, &mcp.StdioTransport{}); err != nil && !errors.Is(err, context.Canceled) {
			log.Fatal(err)
		}
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	hs := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	log.Printf("serving MCP on http://%s/mcp", *listen)
	if err := hs.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// Ticket is what create_ticket returns and find_ticket finds.
type Ticket struct {
	TicketID   string `json:"ticket_id"`
	IncidentID string `json:"incident_id"`
	Title      string `json:"title"`
	Severity   string `json:"severity"`
	URL        string `json:"url"`
	Status     string `json:"status"`
	CreatedAt  string `json:"created_at"`
}

type state struct {
	Next        int       `json:"next"`
	CreateCalls int       `json:"create_calls"`
	Tickets     []*Ticket `json:"tickets"`
	Comments    []comment `json:"comments"`
}

type comment struct {
	TicketID string `json:"ticket_id"`
	Text     string `json:"text"`
}

// store keeps the state in memory and on disk; every change is on disk before the
// tool answers.
type store struct {
	mu   sync.Mutex
	path string
	st   state
}

func openStore(path string) (*store, error) {
	s := &store{path: path, st: state{Next: 1}}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, err
	}
	if err := json.Unmarshal(data, &s.st); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// saveLocked writes the state to a temporary file, syncs it and renames it over the
// old one, so a crash leaves either the old state or the new one.
func (s *store) saveLocked() error {
	data, err := json.MarshalIndent(&s.st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.path), ".tickets-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), s.path)
}

type createArgs struct {
	IncidentID string `json:"incident_id" jsonschema:"the incident the ticket is about"`
	Title      string `json:"title" jsonschema:"one-line summary"`
	Severity   string `json:"severity" jsonschema:"low, medium or high"`
	TraceID    string `json:"trace_id,omitempty" jsonschema:"caller's trace id (informational)"`
}

type findArgs struct {
	IncidentID string `json:"incident_id" jsonschema:"the incident the ticket is about"`
	Title      string `json:"title,omitempty" jsonschema:"the ticket's title, when several tickets share an incident"`
}

type findResult struct {
	Found  bool    `json:"found"`
	Ticket *Ticket `json:"ticket,omitempty"`
}

type listResult struct {
	Count       int       `json:"count"`
	CreateCalls int       `json:"create_calls"`
	Tickets     []*Ticket `json:"tickets"`
}

type ticketArgs struct {
	TicketID string `json:"ticket_id"`
}

type commentArgs struct {
	TicketID string `json:"ticket_id"`
	Text     string `json:"text"`
}

type commentResult struct {
	TicketID string `json:"ticket_id"`
	Comments int    `json:"comments"`
}

func ptr[T any](v T) *T { return &v }

func newServer(s *store, crashFile string, delay time.Duration) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "ticketserver", Version: "1.0.0"}, nil)

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "create_ticket",
		Description: "Open a new ticket for an incident. Every call opens another ticket.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: false, IdempotentHint: false, DestructiveHint: ptr(false)},
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in createArgs) (*mcp.CallToolResult, *Ticket, error) {
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.st.CreateCalls++
		switch in.Severity {
		case "low", "medium", "high":
		default:
			if err := s.saveLocked(); err != nil {
				return nil, nil, err
			}
			return nil, nil, fmt.Errorf("severity must be low, medium or high, not %q", in.Severity)
		}
		t := &Ticket{
			TicketID:   fmt.Sprintf("T-%d", s.st.Next),
			IncidentID: in.IncidentID,
			Title:      in.Title,
			Severity:   in.Severity,
			URL:        fmt.Sprintf("https://tickets.example/T-%d", s.st.Next),
			Status:     "open",
			CreatedAt:  time.Now().UTC().Format(time.RFC3339Nano),
		}
		s.st.Next++
		s.st.Tickets = append(s.st.Tickets, t)
		if err := s.saveLocked(); err != nil {
			return nil, nil, err
		}
		if crashFile != "" {
			if err := os.Remove(crashFile); err == nil {
				// The ticket is stored; the caller never hears of it.
				log.Printf("created %s, crashing before the answer as %s asked", t.TicketID, crashFile)
				p, _ := os.FindProcess(os.Getpid())
				_ = p.Kill()
				select {}
			}
		}
		return nil, t, nil
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "find_ticket",
		Description: "Look up the ticket opened for an incident (and title).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(_ context.Context, _ *mcp.CallToolRequest, in findArgs) (*mcp.CallToolResult, findResult, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, t := range s.st.Tickets {
			if t.IncidentID == in.IncidentID && (in.Title == "" || t.Title == in.Title) {
				return nil, findResult{Found: true, Ticket: t}, nil
			}
		}
		return nil, findResult{}, nil
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "list_tickets",
		Description: "List every ticket, and how many times create_ticket ran.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(_ context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, listResult, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return nil, listResult{Count: len(s.st.Tickets), CreateCalls: s.st.CreateCalls, Tickets: append([]*Ticket{}, s.st.Tickets...)}, nil
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "close_ticket",
		Description: "Close a ticket. Closing a closed ticket changes nothing.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: ptr(false)},
	}, func(_ context.Context, _ *mcp.CallToolRequest, in ticketArgs) (*mcp.CallToolResult, *Ticket, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, t := range s.st.Tickets {
			if t.TicketID == in.TicketID {
				t.Status = "closed"
				if err := s.saveLocked(); err != nil {
					return nil, nil, err
				}
				return nil, t, nil
			}
		}
		return nil, nil, fmt.Errorf("no ticket %q", in.TicketID)
	})

	mcp.AddTool(srv, &mcp.Tool{
		Name:        "add_comment",
		Description: "Add a comment to a ticket. Every call adds another comment.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(false)},
	}, func(_ context.Context, _ *mcp.CallToolRequest, in commentArgs) (*mcp.CallToolResult, commentResult, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.st.Comments = append(s.st.Comments, comment(in))
		if err := s.saveLocked(); err != nil {
			return nil, commentResult{}, err
		}
		n := 0
		for _, c := range s.st.Comments {
			if c.TicketID == in.TicketID {
				n++
			}
		}
		return nil, commentResult{TicketID: in.TicketID, Comments: n}, nil
	})
	return srv
}
