package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/mcpgw"
	"github.com/idemkv/idemkv/telemetry"
)

type mcpGatewayOptions struct {
	upstreamCmd     string
	upstreamURL     string
	listen          string
	policy          string
	maxReceiptBytes int
	logLevel        string
	logFormat       string
	storeWait       time.Duration
	listenTokenFile string
	insecureListen  bool
	approverToken   string // file
	stateKeyFile    string
	http            mcpgw.HTTPConfig
	conn            clientFlags
}

func newMCPGatewayCommand() *cobra.Command {
	o := mcpGatewayOptions{maxReceiptBytes: mcpgw.DefaultMaxReceiptBytes, storeWait: client.DefaultStoreWait, http: mcpgw.DefaultHTTPConfig()}
	cmd := &cobra.Command{
		Use:   "mcp-gateway",
		Short: "Serve an MCP server's tools with idempotent tool calls",
		Long: `Serve the tools of another MCP server (the upstream) and run every mutating
tools/call through idemkv, so that a retried call replays the stored result instead of
running the side effect again. Read-only tools pass straight through.

The upstream is a command speaking MCP on stdio (--upstream-cmd, started again if it
dies) or a streamable HTTP endpoint (--upstream-url). The gateway serves MCP on stdio,
or on streamable HTTP at http://ADDR/mcp with --listen ADDR.

A mutating call needs an idempotency key: _meta["io.idemkv/idempotency_key"], or a key
template from the --policy file. See docs/mcp-gateway.md.

  idemkv mcp-gateway --upstream-cmd "ticketserver --state tickets.json" --policy policy.yaml
  idemkv mcp-gateway --upstream-url http://127.0.0.1:8080/mcp --listen 127.0.0.1:7430`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runMCPGateway(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.upstreamCmd, "upstream-cmd", "", "command line of a stdio MCP server (split like a shell would, without running one)")
	f.StringVar(&o.upstreamURL, "upstream-url", "", "URL of a streamable HTTP MCP server")
	f.StringVar(&o.listen, "listen", "", "serve streamable HTTP on this address (path /mcp) instead of stdio")
	f.StringVar(&o.policy, "policy", "", "policy file (YAML): classes, key templates, effects, probes")
	f.IntVar(&o.maxReceiptBytes, "max-receipt-bytes", o.maxReceiptBytes, "largest tool result stored (at most the nodes' --max-payload-bytes)")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	f.StringVar(&o.logFormat, "log-format", "text", "log format: text or json (logs go to stderr)")
	f.DurationVar(&o.storeWait, "store-wait", o.storeWait, "how long a mutating call waits for an unreachable idemkv before it fails with store_unavailable (the tool is not called)")
	f.DurationVar(&o.http.ShutdownGrace, "shutdown-grace", o.http.ShutdownGrace, "how long shutdown waits for calls in flight (--listen)")
	f.StringVar(&o.listenTokenFile, "listen-token-file", "", "file holding the bearer token every request to --listen must carry (Authorization: Bearer TOKEN)")
	f.BoolVar(&o.insecureListen, "insecure-listen", false, "serve --listen beyond loopback without --listen-token-file (anyone who reaches the port calls tools with the gateway's idemkv token)")
	f.StringVar(&o.approverToken, "approver-token-file", "", "file holding an idemkv token of the approver role, with which the gateway records the decisions its agents' users take in band (policy approval_in_band); default: --token")
	f.StringVar(&o.stateKeyFile, "state-key-file", "", "file holding at least 32 bytes that seal the request state of 2026-07-28 approval questions; give every gateway behind one load balancer the same (default: a random key per process)")
	f.Int64Var(&o.http.MaxBodyBytes, "max-body-bytes", o.http.MaxBodyBytes, "largest request body --listen reads (larger: 413)")
	f.DurationVar(&o.http.ReadHeaderTimeout, "read-header-timeout", o.http.ReadHeaderTimeout, "how long --listen waits for a request's headers")
	f.DurationVar(&o.http.ReadBodyTimeout, "read-body-timeout", o.http.ReadBodyTimeout, "how long --listen waits for a request's body (larger: 408)")
	f.DurationVar(&o.http.IdleTimeout, "idle-timeout", o.http.IdleTimeout, "how long --listen keeps an idle connection open")
	f.DurationVar(&o.http.WriteStallTimeout, "write-stall-timeout", o.http.WriteStallTimeout,
		"how long --listen waits for a client to take any of its answer before it closes the connection")
	f.IntVar(&o.http.MaxConns, "max-conns", o.http.MaxConns, "most connections --listen serves at once (a new one takes an idle one's place, or waits)")
	f.DurationVar(&o.http.SessionIdle, "session-idle-timeout", o.http.SessionIdle,
		"close a session of MCP 2025-11-25 or earlier after this long without a request, a GET stream open or not (its client initializes anew)")
	f.IntVar(&o.http.MaxConnsPerSource, "max-conns-per-source", o.http.MaxConnsPerSource,
		"most connections --listen serves from one IPv4 address or IPv6 /64 (past it a new one takes the place of that source's oldest idle one)")
	o.conn.register(cmd)
	return cmd
}

// runMCPGateway serves until ctx ends or, on stdio, until the client closes stdin.
func runMCPGateway(ctx context.Context, o mcpGatewayOptions, stderr io.Writer) error {
	if (o.upstreamCmd == "") == (o.upstreamURL == "") {
		return errors.New("give exactly one of --upstream-cmd and --upstream-url")
	}
	if o.listen != "" && o.listenTokenFile == "" && !loopback(o.listen) && !o.insecureListen {
		// As serve refuses an API beyond loopback without --auth-file.
		return fmt.Errorf("refusing to serve MCP on %s without a token: set --listen-token-file, listen on loopback, or pass --insecure-listen", o.listen)
	}
	logger, err := newLogger(o.logLevel, o.logFormat, stderr)
	if err != nil {
		return err
	}
	routeLibraryLogs(logger)
	if o.listen == "" && strings.Contains(os.Getenv("OTEL_TRACES_EXPORTER"), "console") {
		// The console exporter writes to stdout, which carries MCP on stdio.
		return errors.New("OTEL_TRACES_EXPORTER=console would write into the MCP stream on stdout; use otlp, or --listen")
	}
	shutdownTracing, err := telemetry.Setup(ctx, "idemkv-mcp-gateway")
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdownTracing(sctx); err != nil {
			logger.Warn("flushing spans", "err", err)
		}
	}()

	policy := &mcpgw.Policy{}
	if o.policy != "" {
		if policy, err = mcpgw.LoadPolicy(o.policy); err != nil {
			return err
		}
	}
	tlsConf, err := o.conn.tlsConfig()
	if err != nil {
		return err
	}
	idem, err := client.New(client.Config{
		Endpoints: o.conn.endpoints, Token: o.conn.token, TLSConfig: tlsConf, Timeout: o.conn.timeout, Logger: logger,
		StoreWait: o.storeWait,
	})
	if err != nil {
		return err
	}
	defer idem.Close()

	transport, err := upstreamTransport(o, stderr)
	if err != nil {
		return err
	}
	up := mcpgw.NewUpstream(transport, &mcp.Implementation{Name: "idemkv-mcp-gateway", Version: version}, logger)
	defer func() {
		if err := up.Close(); err != nil {
			logger.Debug("closing the upstream", "err", err)
		}
	}()
	cfg := mcpgw.DefaultConfig()
	cfg.Upstream, cfg.Runner, cfg.Policy = up, idem, policy
	cfg.MaxReceiptBytes = o.maxReceiptBytes
	cfg.Version = version
	cfg.Logger = logger
	if o.approverToken != "" {
		token, err := readSecretFile("--approver-token-file", o.approverToken)
		if err != nil {
			return err
		}
		approver, err := client.New(client.Config{
			Endpoints: o.conn.endpoints, Token: token, TLSConfig: tlsConf, Timeout: o.conn.timeout, Logger: logger, StoreWait: o.storeWait,
		})
		if err != nil {
			return err
		}
		defer approver.Close()
		cfg.Approver = approver
	}
	if o.stateKeyFile != "" {
		key, err := readSecretFile("--state-key-file", o.stateKeyFile)
		if err != nil {
			return err
		}
		cfg.StateKey = []byte(key)
	}
	gw, err := mcpgw.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer gw.Close()

	if o.listen == "" {
		logger.Info("serving MCP on stdio")
		err := gw.ServeIO(ctx, os.Stdin, os.Stdout)
		if err != nil && ctx.Err() != nil {
			return nil
		}
		return err
	}
	return serveMCPHTTP(ctx, gw, o, logger)
}

func upstreamTransport(o mcpGatewayOptions, stderr io.Writer) (func() mcp.Transport, error) {
	if o.upstreamURL != "" {
		return func() mcp.Transport { return &mcp.StreamableClientTransport{Endpoint: o.upstreamURL} }, nil
	}
	argv, err := splitCommand(o.upstreamCmd)
	if err != nil {
		return nil, fmt.Errorf("--upstream-cmd: %w", err)
	}
	return func() mcp.Transport {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stderr = stderr
		return &mcp.CommandTransport{Command: cmd}
	}, nil
}

func serveMCPHTTP(ctx context.Context, gw *mcpgw.Gateway, o mcpGatewayOptions, logger *slog.Logger) error {
	cfg := o.http
	cfg.Logger = logger
	if o.listenTokenFile != "" {
		token, err := readSecretFile("--listen-token-file", o.listenTokenFile)
		if err != nil {
			return err
		}
		cfg.Token = token
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	logger.Info("serving MCP over streamable HTTP", "url", "http://"+ln.Addr().String()+"/mcp", "token", cfg.Token != "")
	return gw.Serve(ctx, ln, cfg)
}

// readSecretFile reads the secret a flag names: the file's text, trimmed, not empty.
func readSecretFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s %s is empty", flag, path)
	}
	return s, nil
}

// splitCommand splits a command line into words the way a POSIX shell would, without
// running one: single quotes keep everything, double quotes keep everything but \" and
// \\, and a backslash outside quotes escapes the next character. Nothing is expanded.
func splitCommand(s string) ([]string, error) {
	var (
		words  []string
		cur    strings.Builder
		inWord bool
		quote  byte
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case quote == '"':
			switch {
			case c == '"':
				quote = 0
			case c == '\\' && i+1 < len(s) && (s[i+1] == '"' || s[i+1] == '\\'):
				i++
				cur.WriteByte(s[i])
			default:
				cur.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == '\\':
			if i+1 == len(s) {
				return nil, errors.New("trailing backslash")
			}
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unclosed %c quote", quote)
	}
	if inWord {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errors.New("empty command")
	}
	return words, nil
}
