package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/client"
)

// clientFlags are the connection flags every client command shares.
type clientFlags struct {
	endpoints  []string
	token      string
	caCert     string
	clientCert string
	clientKey  string
	timeout    time.Duration
}

func (f *clientFlags) register(cmd *cobra.Command) {
	fl := cmd.PersistentFlags()
	fl.StringSliceVar(&f.endpoints, "endpoint", []string{"127.0.0.1:7420"}, "API address of a node (repeatable; host:port or http(s)://host:port)")
	fl.StringVar(&f.token, "token", "", "bearer token (see idemkv serve --auth-file)")
	fl.StringVar(&f.caCert, "ca-cert", "", "PEM CA bundle that signs the server's certificate (enables https)")
	fl.StringVar(&f.clientCert, "client-cert", "", "PEM client certificate for mutual TLS")
	fl.StringVar(&f.clientKey, "client-key", "", "PEM key of --client-cert")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Second, "timeout of one request")
}

// tlsConfig builds the client side of TLS from the flags, or nil for plain HTTP.
func (f *clientFlags) tlsConfig() (*tls.Config, error) {
	return clientTLSConfig(f.caCert, f.clientCert, f.clientKey)
}

// clientTLSConfig builds a client TLS config: a CA to trust and, for mutual TLS, a
// certificate to present. All empty means plain HTTP (nil).
func clientTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-cert %s: no PEM certificates found", caFile)
		}
		conf.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--client-cert and --client-key go together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

func (f *clientFlags) client() (*client.Client, error) {
	tlsConf, err := f.tlsConfig()
	if err != nil {
		return nil, err
	}
	return client.New(client.Config{Endpoints: f.endpoints, Token: f.token, TLSConfig: tlsConf, Timeout: f.timeout})
}

// run opens a client, calls f and prints its answer as indented JSON.
func (f *clientFlags) run(cmd *cobra.Command, call func(ctx context.Context, c *client.Client) (any, error)) error {
	c, err := f.client()
	if err != nil {
		return err
	}
	defer c.Close()
	out, err := call(cmd.Context(), c)
	if err != nil {
		return err
	}
	return printJSON(cmd.OutOrStdout(), out)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// jsonFlag reads a JSON value from a flag: inline, or @file.
func jsonFlag(name, v string) (json.RawMessage, error) {
	if v == "" {
		return nil, nil
	}
	b := []byte(v)
	if v[0] == '@' {
		var err error
		if b, err = os.ReadFile(v[1:]); err != nil {
			return nil, fmt.Errorf("--%s: %w", name, err)
		}
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("--%s is not valid JSON", name)
	}
	return json.RawMessage(b), nil
}

func addClientCommands(root *cobra.Command) {
	var cf clientFlags
	group := []*cobra.Command{
		newReserveCommand(&cf), newCommitCommand(&cf), newFailCommand(&cf), newReleaseCommand(&cf),
		newHeartbeatCommand(&cf), newGetCommand(&cf), newListCommand(&cf), newResolveCommand(&cf),
		newApprovalsCommand(&cf),
	}
	for _, c := range group {
		cf.register(c)
		root.AddCommand(c)
	}
}

// identity are the flags that name a record.
type identity struct{ tenant, key, fingerprint string }

func (id *identity) register(cmd *cobra.Command, withFingerprint bool) {
	cmd.Flags().StringVar(&id.tenant, "tenant", "", "tenant (required)")
	cmd.Flags().StringVar(&id.key, "key", "", "idempotency key (required)")
	_ = cmd.MarkFlagRequired("tenant")
	_ = cmd.MarkFlagRequired("key")
	if withFingerprint {
		cmd.Flags().StringVar(&id.fingerprint, "fingerprint", "", "effect fingerprint (sha256:…)")
	}
}

func newReserveCommand(cf *clientFlags) *cobra.Command {
	var id identity
	var req idemkv.ReserveRequest
	var effect string
	var lease, ttl time.Duration
	cmd := &cobra.Command{
		Use:   "reserve",
		Short: "Ask for the right to run an effect: execute, replay, conflict, in_progress or recover",
		Example: `  idemkv reserve --tenant acme --key approval_17:create_ticket --tool create_ticket \
    --effect '{"project":"OPS","title":"Outage X"}' --attempt-id worker-a-1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			eff, err := jsonFlag("effect", effect)
			if err != nil {
				return err
			}
			req.Tenant, req.Key, req.Fingerprint, req.Effect = id.tenant, id.key, id.fingerprint, eff
			req.LeaseTTLMs, req.TTLMs = lease.Milliseconds(), ttl.Milliseconds()
			if req.AttemptID == "" {
				req.AttemptID = client.NewAttemptID()
			}
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.Reserve(ctx, &req) })
		},
	}
	id.register(cmd, true)
	f := cmd.Flags()
	f.StringVar(&req.Tool, "tool", "", "tool name (required)")
	f.StringVar(&req.Actor, "actor", "", "who asks (not part of the identity)")
	f.StringVar(&effect, "effect", "", "the effect as JSON, or @file; the server fingerprints it (instead of --fingerprint)")
	f.StringVar(&req.AttemptID, "attempt-id", "", "attempt id; reuse it to retry the same attempt (default: random)")
	f.DurationVar(&lease, "lease-ttl", 0, "lease (default: the server's, 30s)")
	f.DurationVar(&ttl, "ttl", 0, "retention (default: the server's, 24h)")
	_ = cmd.MarkFlagRequired("tool")
	return cmd
}

func newCommitCommand(cf *clientFlags) *cobra.Command {
	var id identity
	var req idemkv.CommitRequest
	var result string
	cmd := &cobra.Command{
		Use:   "commit",
		Short: "Store the receipt of an executed effect (also: settle an in-doubt record by hand)",
		Example: `  idemkv commit --tenant acme --key approval_17:create_ticket --fingerprint sha256:… --fence 42 \
    --remote-system linear --remote-id LIN-1842 --result '{"state":"open"}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := jsonFlag("result", result)
			if err != nil {
				return err
			}
			req.Tenant, req.Key, req.Fingerprint, req.Result = id.tenant, id.key, id.fingerprint, res
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.Commit(ctx, &req) })
		},
	}
	id.register(cmd, true)
	f := cmd.Flags()
	f.Uint64Var(&req.Fence, "fence", 0, "the fence reserve granted (required)")
	f.StringVar(&req.RemoteSystem, "remote-system", "", "downstream system (required)")
	f.StringVar(&req.RemoteID, "remote-id", "", "the effect's id downstream (required)")
	f.StringVar(&req.RemoteURL, "remote-url", "", "link to the effect")
	f.StringVar(&result, "result", "", "result as JSON, or @file")
	for _, n := range []string{"fingerprint", "fence", "remote-system", "remote-id"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

func newFailCommand(cf *clientFlags) *cobra.Command {
	var id identity
	var req idemkv.FailRequest
	var details string
	cmd := &cobra.Command{
		Use:   "fail",
		Short: "Store a permanent failure; every retry gets it back",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := jsonFlag("details", details)
			if err != nil {
				return err
			}
			req.Tenant, req.Key, req.Fingerprint, req.Error.Details = id.tenant, id.key, id.fingerprint, d
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.Fail(ctx, &req) })
		},
	}
	id.register(cmd, true)
	f := cmd.Flags()
	f.Uint64Var(&req.Fence, "fence", 0, "the fence reserve granted (required)")
	f.StringVar(&req.Error.Code, "code", "", "error code (required)")
	f.StringVar(&req.Error.Message, "message", "", "error message")
	f.StringVar(&details, "details", "", "details as JSON, or @file")
	for _, n := range []string{"fingerprint", "fence", "code"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

func newReleaseCommand(cf *clientFlags) *cobra.Command {
	var id identity
	var req idemkv.ReleaseRequest
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Give a pending key back: the effect certainly did not happen",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Tenant, req.Key, req.Fingerprint = id.tenant, id.key, id.fingerprint
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.Release(ctx, &req) })
		},
	}
	id.register(cmd, true)
	cmd.Flags().Uint64Var(&req.Fence, "fence", 0, "the record's current fence (required)")
	_ = cmd.MarkFlagRequired("fingerprint")
	_ = cmd.MarkFlagRequired("fence")
	return cmd
}

func newHeartbeatCommand(cf *clientFlags) *cobra.Command {
	var id identity
	var req idemkv.HeartbeatRequest
	var lease time.Duration
	cmd := &cobra.Command{
		Use:   "heartbeat",
		Short: "Extend the lease of the attempt holding the fence",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Tenant, req.Key, req.LeaseTTLMs = id.tenant, id.key, lease.Milliseconds()
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.Heartbeat(ctx, &req) })
		},
	}
	id.register(cmd, false)
	cmd.Flags().Uint64Var(&req.Fence, "fence", 0, "the fence reserve granted (required)")
	cmd.Flags().DurationVar(&lease, "lease-ttl", 0, "new lease (default: the server's)")
	_ = cmd.MarkFlagRequired("fence")
	return cmd
}

func newGetCommand(cf *clientFlags) *cobra.Command {
	var id identity
	var wait time.Duration
	var stale, history bool
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Read one record (linearizable unless --stale; --wait long-polls while it is pending; --history with its last events)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req := idemkv.GetRequest{Tenant: id.tenant, Key: id.key, Wait: wait, Consistency: idemkv.Linearizable, History: history}
			if stale {
				req.Consistency = idemkv.Stale
			}
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) {
				rec, err := c.Get(ctx, &req)
				var e *idemkv.Error
				if errors.As(err, &e) && e.Details != nil && e.Details.Released != nil {
					// No record, but the history of the one released there: printed as
					// the answer's details say it, and the command still fails with
					// not_found.
					if perr := printJSON(cmd.OutOrStdout(), e.Details); perr != nil {
						return nil, perr
					}
				}
				return rec, err
			})
		},
	}
	id.register(cmd, false)
	cmd.Flags().DurationVar(&wait, "wait", 0, "long-poll up to this long while the record is pending")
	cmd.Flags().BoolVar(&stale, "stale", false, "read the node's local replica")
	cmd.Flags().BoolVar(&history, "history", false, "include the record's history (its last 16 events, oldest first); for a released key, print the history it left ({\"released\":…}) and fail with not_found")
	return cmd
}

func newListCommand(cf *clientFlags) *cobra.Command {
	var req idemkv.ListRequest
	var status string
	var all, stale bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List a tenant's records in key order, or every tenant's in-doubt records oldest first",
		Example: `  idemkv ls --tenant acme --status pending
  idemkv ls --tenant acme --prefix conversation_9: --all
  idemkv ls --tenant acme --in-doubt --all     # effects nobody can tell happened; settle with idemkv resolve
  idemkv ls --in-doubt --all --token "$ADMIN"  # every tenant's, oldest first: tenant, key, tool, age, attempts`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Status = idemkv.Status(status)
			if stale {
				req.Consistency = idemkv.Stale
			}
			if req.Tenant == "" {
				if !req.InDoubt {
					return errors.New("--tenant is required; only --in-doubt lists every tenant")
				}
				if req.Prefix != "" || req.Status != "" {
					return errors.New("--prefix and --status need --tenant")
				}
				doubt := idemkv.InDoubtRequest{Limit: req.Limit, After: req.After, Consistency: req.Consistency}
				return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) {
					return listInDoubt(ctx, c, &doubt, all, time.Now())
				})
			}
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) {
				page, err := c.List(ctx, &req)
				if err != nil || !all {
					return page, err
				}
				out := &idemkv.ListResult{Records: page.Records}
				for page.Next != "" {
					req.After = page.Next
					if page, err = c.List(ctx, &req); err != nil {
						return nil, err
					}
					out.Records = append(out.Records, page.Records...)
				}
				return out, nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Tenant, "tenant", "", "tenant (required, but for --in-doubt, which without it lists every tenant)")
	f.StringVar(&req.Prefix, "prefix", "", "only keys with this prefix")
	f.StringVar(&status, "status", "", "only records with this status: pending, committed, failed")
	f.IntVar(&req.Limit, "limit", 0, "records per page (default 100, max 1000)")
	f.StringVar(&req.After, "after", "", "start after this key, or this cursor without --tenant (the next of a previous page)")
	f.BoolVar(&all, "all", false, "follow next until the last page")
	f.BoolVar(&req.InDoubt, "in-doubt", false, "only pending records marked in doubt (settle them with idemkv resolve); "+
		"without --tenant, those of every tenant, oldest first (takes an admin token)")
	f.BoolVar(&stale, "stale", false, "read the node's local replica")
	return cmd
}

// doubtEntry is what ls --in-doubt shows of a record when it lists every tenant: who to
// ask, how long it has waited, and what idemkv resolve needs.
type doubtEntry struct {
	Tenant       string           `json:"tenant"`
	Key          string           `json:"idempotency_key"`
	Tool         string           `json:"tool"`
	Age          string           `json:"age"`
	Attempts     uint32           `json:"attempts"`
	InDoubtSince idemkv.Timestamp `json:"in_doubt_since"`
}

// doubtPage is a page of doubtEntry, in the shape of a list's page.
type doubtPage struct {
	Records []doubtEntry `json:"records"`
	Next    string       `json:"next,omitempty"`
}

// listInDoubt reads one page of every tenant's in-doubt records, or with all every
// page, and shows each record's age at now (this machine's clock).
func listInDoubt(ctx context.Context, c *client.Client, req *idemkv.InDoubtRequest, all bool, now time.Time) (*doubtPage, error) {
	out := &doubtPage{Records: []doubtEntry{}}
	for {
		page, err := c.ListInDoubt(ctx, req)
		if err != nil {
			return nil, err
		}
		for _, rec := range page.Records {
			age := max(now.Sub(rec.InDoubtSince.Time()), 0).Truncate(time.Second)
			out.Records = append(out.Records, doubtEntry{Tenant: rec.Tenant, Key: rec.Key, Tool: rec.Tool,
				Age: age.String(), Attempts: rec.Attempts, InDoubtSince: rec.InDoubtSince})
		}
		out.Next = page.Next
		if !all || page.Next == "" {
			return out, nil
		}
		req.After = page.Next
	}
}
