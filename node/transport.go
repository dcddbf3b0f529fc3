package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
)

// streamLayer carries Raft RPCs over TCP, optionally wrapped in (mutual) TLS. With a
// TLS config, a peer that cannot present a certificate the config accepts never gets
// to speak Raft: the handshake runs before the transport sees the connection.
type streamLayer struct {
	net.Listener
	advertise net.Addr
	tls       *tls.Config
}

func newStreamLayer(bind, advertise string, tlsConf *tls.Config) (*streamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("node: listen for raft on %s: %w", bind, err)
	}
	var adv net.Addr = ln.Addr()
	if advertise != "" {
		a, err := net.ResolveTCPAddr("tcp", advertise)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("node: raft advertise address %q: %w", advertise, err)
		}
		adv = a
	}
	if tcp, ok := adv.(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		ln.Close()
		return nil, errors.New("node: the raft address peers dial must not be unspecified (0.0.0.0); set an advertise address")
	}
	s := &streamLayer{Listener: ln, advertise: adv, tls: tlsConf}
	if tlsConf != nil {
		s.Listener = tls.NewListener(ln, tlsConf)
	}
	return s, nil
}

func (s *streamLayer) Addr() net.Addr { return s.advertise }

func (s *streamLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	if s.tls == nil {
		return d.Dial("tcp", string(addr))
	}
	return tls.DialWithDialer(d, "tcp", string(addr), s.tls)
}

// peerAddresses makes this node dial some peers at other addresses than the ones in
// the Raft configuration: a NAT, or a fault-injection proxy on one directed link.
type peerAddresses map[string]string

func (p peerAddresses) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if a, ok := p[string(id)]; ok {
		return raft.ServerAddress(a), nil
	}
	return "", errNoOverride
}

var errNoOverride = errors.New("no address override")
