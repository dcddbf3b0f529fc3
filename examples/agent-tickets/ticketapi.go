package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemkv/idemkv/client"
)

// ticketAPI is a fake incident tracker, served over HTTP on loopback. It counts every
// ticket it really creates, and can be told to time out after creating one: the
// failure that makes retries dangerous.
type ticketAPI struct {
	srv *http.Server
	url string

	mu      sync.Mutex
	tickets map[string]ticket // by external id
	perExt  map[string]int    // tickets created per external id
	created int
	// slowAfterCreate makes the next n creations answer only after the caller gave up.
	slowAfterCreate atomic.Int32
}

type ticket struct {
	ID         string `json:"id"`
	URL        string `json:"url"`
	ExternalID string `json:"external_id"`
	Title      string `json:"title"`
	Severity   string `json:"severity"`
}

func startTicketAPI() (*ticketAPI, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &ticketAPI{tickets: map[string]ticket{}, perExt: map[string]int{}, url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tickets", a.create)
	mux.HandleFunc("GET /tickets", a.find)
	a.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = a.srv.Serve(ln) }()
	return a, nil
}

func (a *ticketAPI) close() { _ = a.srv.Close() }

func (a *ticketAPI) create(w http.ResponseWriter, r *http.Request) {
	var t ticket
	if err := json.NewDecoder(r.Body).Decode(&t); err != nil || t.ExternalID == "" || t.Title == "" {
		http.Error(w, `{"error":"external_id and title are required"}`, http.StatusUnprocessableEntity)
		return
	}
	a.mu.Lock()
	a.created++
	t.ID = fmt.Sprintf("LIN-%d", 1841+a.created)
	t.URL = "https://linear.example/issue/" + t.ID
	a.tickets[t.ExternalID] = t
	a.perExt[t.ExternalID]++
	a.mu.Unlock()

	if a.slowAfterCreate.Add(-1) >= 0 {
		// The ticket exists; the answer comes too late for the caller.
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(t)
}

func (a *ticketAPI) find(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	t, ok := a.tickets[r.URL.Query().Get("external_id")]
	a.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(t)
}

// count returns how many tickets exist for an external id, and in total.
func (a *ticketAPI) count(externalID string) (forID, total int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.perExt[externalID], a.created
}

// ticketClient is the agent runtime's adapter to the ticket API: the tool and its
// probe. It uses the idempotency key as the ticket's external id, which is what makes
// the probe possible.
type ticketClient struct {
	base    string
	http    *http.Client
	timeout time.Duration
}

type ticketArgs struct {
	Title    string
	Severity string
}

// createTicket is the tool. Its errors tell Do what may have happened downstream.
func (c *ticketClient) createTicket(externalID string, args ticketArgs) client.Func {
	return func(ctx context.Context) (*client.Result, error) {
		ctx, cancel := context.WithTimeout(ctx, c.timeout)
		defer cancel()
		body, _ := json.Marshal(ticket{ExternalID: externalID, Title: args.Title, Severity: args.Severity})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/tickets", bytes.NewReader(body))
		if err != nil {
			return nil, client.NotExecuted(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.http.Do(req)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			// Nothing was sent: the key can be given back.
			return nil, client.NotExecuted(err)
		case err != nil:
			// Sent, and no answer: the ticket may exist. Do leaves the record pending.
			return nil, fmt.Errorf("create ticket: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 == 4 {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			return nil, &client.PermanentError{Code: "ticket_rejected", Err: fmt.Errorf("ticket API: %s: %s", resp.Status, msg)}
		}
		var t ticket
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&t) != nil {
			return nil, fmt.Errorf("create ticket: unexpected answer %s", resp.Status)
		}
		return &client.Result{RemoteSystem: "linear", RemoteID: t.ID, RemoteURL: t.URL,
			Result: map[string]string{"title": t.Title, "severity": t.Severity}}, nil
	}
}

// probe looks the ticket up by external id after an attempt died.
func (c *ticketClient) probe(externalID string) client.ProbeFunc {
	return func(ctx context.Context) (*client.Result, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/tickets?external_id="+url.QueryEscape(externalID), nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.http.Do(req)
		if err != nil {
			return nil, fmt.Errorf("probe: %w", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			return nil, nil
		}
		var t ticket
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&t) != nil {
			return nil, fmt.Errorf("probe: unexpected answer %s", resp.Status)
		}
		return &client.Result{RemoteSystem: "linear", RemoteID: t.ID, RemoteURL: t.URL}, nil
	}
}
