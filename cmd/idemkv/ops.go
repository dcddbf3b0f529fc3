package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/auth"
	"github.com/idemkv/idemkv/client"
	"github.com/idemkv/idemkv/fsm"
	"github.com/idemkv/idemkv/node"
	"github.com/idemkv/idemkv/storage"
)

// addExtraCommands adds the operator commands beyond serving and the client.
func addExtraCommands(root *cobra.Command) {
	root.AddCommand(newAuthCommand(), newBackupCommand(), newRestoreCommand(), newMembersCommand(), newStatusCommand())
}

func newAuthCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "auth", Short: "Tokens for --auth-file"}
	var generate bool
	hash := &cobra.Command{
		Use:   "hash-token [TOKEN]",
		Short: "Print the hash of a token for the token file (reads the token from stdin without an argument)",
		Long: `Print the hash a token file stores for a token. The token comes from the argument,
or from the first line of standard input, which keeps it out of the shell history.
With --generate, a new random token is made: the first line printed is the token (give
it to the client), the second its hash (put it in the token file).

  idemkv auth hash-token --generate
  printf %s "$TOKEN" | idemkv auth hash-token`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if generate {
				if len(args) > 0 {
					return errors.New("--generate makes its own token; give none")
				}
				tok, err := auth.NewToken()
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(out, "%s\n%s\n", tok, auth.HashToken(tok))
				return err
			}
			var tok string
			if len(args) == 1 {
				tok = args[0]
			} else {
				line, err := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				if err != nil && !errors.Is(err, io.EOF) {
					return fmt.Errorf("reading the token: %w", err)
				}
				tok = strings.TrimRight(line, "\r\n")
			}
			if tok == "" {
				return errors.New("no token given")
			}
			_, err := fmt.Fprintln(out, auth.HashToken(tok))
			return err
		},
	}
	hash.Flags().BoolVar(&generate, "generate", false, "make a new random token and print it with its hash")
	cmd.AddCommand(hash)
	return cmd
}

func newBackupCommand() *cobra.Command {
	var cf clientFlags
	var out string
	cmd := &cobra.Command{
		Use:   "backup --out FILE",
		Short: "Take a consistent backup of a running cluster through its API (admin token)",
		Long: `Take a consistent backup of a running cluster. Any node serves it (followers forward
to the leader); it holds every write acknowledged before it started, and writes go on
while it runs. The file is written next to FILE, checked by restoring it into a scratch
store beside it, and only then renamed to FILE, so FILE is always a complete backup.

  idemkv backup --out idemkv-$(date +%F).backup --endpoint 127.0.0.1:7420 --token "$ADMIN_TOKEN"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			return runBackup(cmd.Context(), c, out, cmd.OutOrStdout())
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&out, "out", "", "file to write (must not exist)")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}

func runBackup(ctx context.Context, c *client.Client, out string, w io.Writer) (err error) {
	if _, err := os.Stat(out); err == nil {
		return fmt.Errorf("%s exists; backups never overwrite", out)
	}
	dir := filepath.Dir(out)
	removeStaleBackupFiles(dir, time.Now(), w)
	tmp, err := os.CreateTemp(dir, backupTempPrefix+"*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	// A transfer that breaks leaves a partial file, which the deferred cleanup removes:
	// the operator runs the backup again.
	written, err := c.Backup(ctx, tmp)
	if err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	v, err := verifyBackup(dir, tmp)
	if err != nil {
		return fmt.Errorf("the backup does not verify, nothing written to %s: %w", out, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := placeExclusively(tmp.Name(), out); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "wrote %s: %d bytes, %d records, index %d, term %d\n", out, written, v.Records, v.Index, v.Term)
	return err
}

// placeExclusively gives the finished file tmp the name out, failing if out exists by
// then: the check at the start is long past (a backup takes minutes), and a rename
// would replace whatever was created at out meanwhile. A hard link is made only if the
// name is free, atomically; where the file system has no hard links, the bytes are
// copied into a file created with O_EXCL. tmp is gone afterwards either way, and out
// is synced into its directory.
func placeExclusively(tmp, out string) (err error) {
	defer func() { err = errors.Join(err, os.Remove(tmp)) }()
	switch err := os.Link(tmp, out); {
	case errors.Is(err, fs.ErrExist):
		return createdMeanwhile(out)
	case err != nil:
		if err := copyExclusively(tmp, out); err != nil {
			return err
		}
	}
	return syncDir(filepath.Dir(out))
}

func createdMeanwhile(out string) error {
	return fmt.Errorf("%s was created while the backup ran; backups never overwrite (this backup is discarded)", out)
}

// copyExclusively copies tmp into a new file out, made with O_EXCL.
func copyExclusively(tmp, out string) (err error) {
	src, err := os.Open(tmp)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, storage.PrivateFileMode)
	if errors.Is(err, fs.ErrExist) {
		return createdMeanwhile(out)
	}
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, os.Remove(out))
		}
	}()
	if _, err := io.Copy(dst, src); err != nil {
		return errors.Join(err, dst.Close())
	}
	if err := dst.Sync(); err != nil {
		return errors.Join(err, dst.Close())
	}
	return dst.Close()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// verifyBackup restores r into a scratch store in dir, which checks every frame and
// the checksum trailer, and reports what the backup holds.
func verifyBackup(dir string, r io.Reader) (info *node.RestoreInfo, err error) {
	scratch, err := os.MkdirTemp(dir, verifyTempPrefix+"*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(scratch)
	st, err := storage.Open(scratch, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, st.Close()) }()
	if err := st.Restore(r); err != nil {
		return nil, err
	}
	index, term, err := st.Applied()
	if err != nil {
		return nil, err
	}
	if index == 0 {
		return nil, fmt.Errorf("no applied index: %w", storage.ErrCorrupt)
	}
	// The records, as restore counts them (Overdue would count released keys'
	// tombstones too, and the two commands would disagree).
	return &node.RestoreInfo{Index: index, Term: term, Records: int(st.RecordCount())}, nil
}

func newRestoreCommand() *cobra.Command {
	var from, logLevel string
	cfg := node.DefaultConfig()
	cmd := &cobra.Command{
		Use:   "restore --from FILE --data-dir DIR --id ID --raft-addr ADDR",
		Short: "Seed the data dir of a new cluster's first node from a backup",
		Long: `Seed an empty data dir from a backup. Start idemkv serve on it with the same --id and
--raft-addr (or --advertise-raft-addr): the node comes up as a single-node cluster that
holds every record of the backup and continues its Raft log, so every new fence is
above every restored one. Then join the other nodes to it as usual (--join).

  idemkv restore --from idemkv.backup --data-dir /var/lib/idemkv --id n1 --raft-addr 10.0.0.1:7421
  idemkv serve   --data-dir /var/lib/idemkv --id n1 --raft-addr 10.0.0.1:7421 ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			logger, err := newLogger(logLevel, "text", cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			cfg.Logger = logger
			f, err := os.Open(from)
			if err != nil {
				return err
			}
			defer f.Close()
			var size int64
			if st, err := f.Stat(); err == nil {
				size = st.Size()
			}
			in := &restoreInput{ctx: cmd.Context(), r: f}
			stop := in.report(cmd.ErrOrStderr(), size, restoreProgressEvery)
			info, err := node.Restore(cfg, in)
			stop()
			if err != nil {
				return err
			}
			// The same addresses, so that the first start, which checks them, accepts it.
			addrs := "--raft-addr " + cfg.RaftAddr
			if cfg.RaftAdvertise != "" {
				addrs += " --advertise-raft-addr " + cfg.RaftAdvertise
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(),
				"restored %d records into %s at index %d, term %d; new fences start past index %d\nstart it with: idemkv serve --id %s --data-dir %s %s\n",
				info.Records, cfg.DataDir, info.Index, info.Term, info.ContinuesAt, cfg.ID, cfg.DataDir, addrs)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&from, "from", "", "backup file (from idemkv backup)")
	fl.StringVar(&cfg.DataDir, "data-dir", "", "data dir to seed; must be empty or absent")
	fl.StringVar(&cfg.RaftLog, "raft-log", "", raftLogUsage)
	fl.StringVar(&cfg.ID, "id", "", "ID of the node that will serve the data dir")
	fl.StringVar(&cfg.RaftAddr, "raft-addr", cfg.RaftAddr, "the node's --raft-addr")
	fl.StringVar(&cfg.RaftAdvertise, "advertise-raft-addr", "", "the node's --advertise-raft-addr, if it has one")
	fl.StringVar(&logLevel, "log-level", "warn", "log level: debug, info, warn, error")
	for _, n := range []string{"from", "data-dir", "id"} {
		_ = cmd.MarkFlagRequired(n)
	}
	return cmd
}

func newMembersCommand() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "members",
		Short: "Add nodes to the cluster or remove them (admin token)",
		Long: `Change the membership through any node (followers forward to the leader).

A node that leaves for good should be removed while it still runs, then stopped: the
cluster shrinks its quorum first, so the node's absence never counts against it, and
the removed node stops taking part at once. A removed leader steps down once the
change commits, and the others elect a leader within an election timeout. Stopping
a node with SIGTERM without removing it keeps it a member (it is expected back); a
leader hands leadership over before it stops.`,
	}
	cf.register(cmd)
	var join idemkv.JoinRequest
	add := &cobra.Command{
		Use:   "add --id ID --raft-addr HOST:PORT --api-addr HOST:PORT",
		Short: "Add a node as a voter (a new node started with --join does this itself)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.Join(ctx, &join) })
		},
	}
	add.Flags().StringVar(&join.ID, "id", "", "node ID")
	add.Flags().StringVar(&join.RaftAddr, "raft-addr", "", "Raft address peers dial")
	add.Flags().StringVar(&join.APIAddr, "api-addr", "", "API address clients and peers use")
	add.Flags().IntVar(&join.Format, "format", fsm.FormatVersion, "the data format the node's release reads (2: a release before formats; a node that reads less than the cluster's is refused)")
	add.Flags().StringVar(&join.Stage, "stage", "", "learner: add the node as a nonvoter, which gets the state but neither votes nor counts toward a quorum; promote: make a nonvoter member a voter (once it caught up); default: a voter at once")
	var rm idemkv.RemoveRequest
	remove := &cobra.Command{
		Use:   "remove --id ID",
		Short: "Remove a node from the cluster (graceful leave: remove, then stop it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.run(cmd, func(ctx context.Context, c *client.Client) (any, error) { return c.Remove(ctx, &rm) })
		},
	}
	remove.Flags().StringVar(&rm.ID, "id", "", "node ID")
	remove.Flags().BoolVar(&rm.Force, "force", false, "remove it even when the voters left that the leader reaches are short of their quorum (the cluster then commits nothing until enough are back)")
	for _, c := range []*cobra.Command{add, remove} {
		_ = c.MarkFlagRequired("id")
	}
	for _, n := range []string{"raft-addr", "api-addr"} {
		_ = add.MarkFlagRequired(n)
	}
	cmd.AddCommand(add, remove)
	return cmd
}

// NodeStatus is one line of idemkv status: a node as it sees itself.
type NodeStatus = client.NodeStatus

func newStatusCommand() *cobra.Command {
	var cf clientFlags
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every node's role, term, commit and applied index, and lag",
		Long: `Ask one node for the membership, then every member for its own view: its role, term,
commit index and applied index. Lag is the leader's commit index minus the node's
applied index. Nodes that do not answer are shown with the error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			nodes, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), nodes)
			}
			return printStatus(cmd.OutOrStdout(), nodes)
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// formatColumn shows the format a member reads and, after a slash, the cluster's as
// it holds it: "3/2" is an upgraded node in a cluster still at 2.
func formatColumn(n NodeStatus) string {
	reads := "-"
	if n.Format != 0 {
		reads = strconv.Itoa(n.Format)
	}
	if n.ClusterFormat == 0 {
		return reads
	}
	return reads + "/" + strconv.Itoa(n.ClusterFormat)
}

func printStatus(w io.Writer, nodes []NodeStatus) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROLE\tSUFFRAGE\tTERM\tCOMMIT\tAPPLIED\tLAG\tFORMAT\tAPI\tRAFT")
	dash := func(v uint64, ok bool) string {
		if !ok {
			return "-"
		}
		return strconv.FormatUint(v, 10)
	}
	for _, n := range nodes {
		ok := n.Error == ""
		lag := "-"
		if n.Lag != nil {
			lag = strconv.FormatUint(*n.Lag, 10)
		}
		role := n.Role
		if !ok {
			role = "unreachable"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.ID, role, n.Suffrage,
			dash(n.Term, ok), dash(n.CommitIndex, ok), dash(n.AppliedIndex, ok), lag, formatColumn(n), n.APIAddr, n.RaftAddr)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range nodes {
		if n.Error != "" {
			if _, err := fmt.Fprintf(w, "%s: %s\n", n.ID, n.Error); err != nil {
				return err
			}
		}
	}
	return nil
}

// restoreProgressEvery is how often restore says how far it read.
const restoreProgressEvery = 5 * time.Second

// restoreInput is the backup a restore reads: it ends with the command's context, so
// that SIGINT or SIGTERM stop the restore as a failure (node.Restore then leaves the
// data dir empty; a kill leaves it marked unfinished), and it counts what was read.
type restoreInput struct {
	ctx  context.Context
	r    io.Reader
	read atomic.Int64
}

func (in *restoreInput) Read(p []byte) (int, error) {
	if err := in.ctx.Err(); err != nil {
		return 0, fmt.Errorf("restore stopped: %w", err)
	}
	n, err := in.r.Read(p)
	in.read.Add(int64(n))
	return n, err
}

// report writes to w, every interval, how much of size bytes was read, until the
// returned stop is called.
func (in *restoreInput) report(w io.Writer, size int64, interval time.Duration) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				n := in.read.Load()
				if size > 0 {
					fmt.Fprintf(w, "restore: read %.1f of %.1f MiB (%d%%)\n", float64(n)/(1<<20), float64(size)/(1<<20), n*100/size)
				} else {
					fmt.Fprintf(w, "restore: read %.1f MiB\n", float64(n)/(1<<20))
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// The names of what a backup writes beside --out while it runs: the download, the
// scratch store that checks it, and that store's staging directory.
const (
	backupTempPrefix = ".idemkv-backup-"
	verifyTempPrefix = ".idemkv-verify-"
)

// staleBackupFiles is how old a backup's file beside --out must be to be one a killed
// backup left: a transfer ends within idemkv.MaxBackupDuration, and its check soon
// after.
const staleBackupFiles = 3 * idemkv.MaxBackupDuration

// removeStaleBackupFiles removes from dir what backups that were killed left there (a
// killed process cleans up nothing, and each left a copy of the store the size of the
// backup), saying so on w. A backup still running has files younger than
// staleBackupFiles, and they stay.
func removeStaleBackupFiles(dir string, now time.Time, w io.Writer) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, backupTempPrefix) && !strings.HasPrefix(name, verifyTempPrefix) {
			continue
		}
		info, err := e.Info()
		if err != nil || now.Sub(info.ModTime()) < staleBackupFiles {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			fmt.Fprintf(w, "could not remove %s, left by a backup that did not finish: %v\n", name, err)
			continue
		}
		fmt.Fprintf(w, "removed %s, left by a backup that did not finish on %s\n", name, info.ModTime().UTC().Format(time.RFC3339))
	}
}
