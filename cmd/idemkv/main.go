// Command idemkv is the idempotency store for side-effecting tool calls: the server
// (`idemkv serve`), its operator commands, and a command-line client.
//
// This is the one place that knows every package; it only wires them together.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/idemkv/idemkv/loadgen"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRootCommand()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "idemkv:", err)
		os.Exit(exitCode(err))
	}
}

// exitError carries a specific exit status out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return 1
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "idemkv",
		Short: "The idempotency store for side-effecting tool calls of AI agents",
		Long: `idemkv answers, before a mutating tool runs, whether to execute it, replay the
stored receipt, report a conflict, wait for an attempt in progress, or recover one that
died. One node needs nothing else; three or five replicate through Raft.

Every flag can also be set with an environment variable: IDEMKV_ and the flag name in
upper case with dashes as underscores (--data-dir is IDEMKV_DATA_DIR).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return bindEnv(cmd)
		},
	}
	root.AddCommand(
		newServeCommand(),
		newVersionCommand(),
		newMCPGatewayCommand(),
		loadgen.NewBenchCommand(),
	)
	addClientCommands(root)
	addExtraCommands(root)
	return root
}

// bindEnv sets every flag the command line did not set from its IDEMKV_* variable.
func bindEnv(cmd *cobra.Command) error {
	var errs []error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		name := "IDEMKV_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		v, ok := os.LookupEnv(name)
		if !ok {
			return
		}
		if sv, isSlice := f.Value.(pflag.SliceValue); isSlice {
			if err := sv.Replace(splitList(v)); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
	})
	return errors.Join(errs...)
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of idemkv",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), "idemkv", version)
			return nil
		},
	}
}
