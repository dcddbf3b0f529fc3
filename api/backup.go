package api

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemkv/idemkv"
)

// Backuper is implemented by stores that can stream a consistent backup of their whole
// state: every write acknowledged before the call is in it. A store that is not the
// leader fails with idemkv.ErrNotLeader before writing anything.
type Backuper interface {
	Backup(ctx context.Context, w io.Writer) error
}

// MaxBackupDuration and BackupContentType are the root package's, named here for the
// API's readers (idemkv.MaxBackupDuration, idemkv.BackupContentType).
const (
	MaxBackupDuration = idemkv.MaxBackupDuration
	BackupContentType = idemkv.BackupContentType
)

// mountBackup registers GET /v1/backup when the store can take backups.
func (s *Server) mountBackup() {
	b, ok := s.store.(Backuper)
	if !ok {
		return
	}
	s.handle("GET /v1/backup", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.backup(b, w, r)
	}))
}

func (s *Server) backup(b Backuper, w http.ResponseWriter, r *http.Request) {
	if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(MaxBackupDuration)); err != nil {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "cannot lift the write timeout for a backup", slog.Any(logKeyErr, err))
	}
	if s.forwardIfFollower(w, r, nil, MaxBackupDuration) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), MaxBackupDuration)
	defer cancel()
	bw := &backupWriter{w: w}
	err := b.Backup(ctx, bw)
	switch {
	case err == nil && !bw.started:
		s.writeError(w, r, errors.New("api: the store wrote an empty backup"))
	case err == nil:
	case !bw.started && errors.Is(err, idemkv.ErrNotLeader):
		s.forwardToLeader(w, r, nil, MaxBackupDuration)
	case !bw.started:
		s.writeError(w, r, err)
	default:
		// The status is out: cut the connection, so that the client sees a broken
		// transfer rather than a clean end of a short stream.
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "backup failed while streaming", slog.Any(logKeyErr, err))
		panic(http.ErrAbortHandler)
	}
}

// backupWriter sends the headers of a successful backup with its first bytes, so that
// an error before them still gets an error answer.
type backupWriter struct {
	w       http.ResponseWriter
	started bool
}

func (b *backupWriter) Write(p []byte) (int, error) {
	if !b.started {
		b.started = true
		h := b.w.Header()
		h.Set("Content-Type", BackupContentType)
		h.Set("Cache-Control", "no-store")
		b.w.WriteHeader(http.StatusOK)
	}
	return b.w.Write(p)
}
