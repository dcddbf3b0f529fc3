package idemkv

import "time"

// The backup stream, GET /v1/backup (docs/protocol.md, section 2): the server (api)
// answers with it and the client checks for it, so both read these from here.
const (
	// BackupContentType is the media type of a backup stream.
	BackupContentType = "application/vnd.idemkv.backup"
	// MaxBackupDuration bounds one backup, forwarded or not: the server lifts its write
	// timeout to it for the backup's connection alone, and the client waits as long.
	MaxBackupDuration = time.Hour
)
