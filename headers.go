package idemkv

// HeaderLeader is the answer header that carries the API address of the leader on
// every answer, so that clients can go straight to it. It lives here, in the wire
// vocabulary both the server (api) and the client import, so the two cannot drift.
const HeaderLeader = "Idemkv-Leader"
