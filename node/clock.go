package node

import (
	"sync"
	"time"

	"github.com/idemkv/idemkv"
	"github.com/idemkv/idemkv/fsm"
)

// clockWarnEvery spaces the warnings of a node whose stamps keep being clamped: a clock
// an hour off is clamped on every command for hours (fsm.ClockSlew).
const clockWarnEvery = 10 * time.Second

// stampClock is the time this node stamps on commands and reads records at: its wall
// clock (Config.Now) within fsm.BoundStamp's band around the latest state-machine time
// it has seen, advanced by its monotonic clock since.
//
// The band needs a moment on this node's monotonic clock at which that time was
// current: the node's own stamp, or an entry applied live. Entries it replays from its
// own log after a start were stamped an unknown while ago (a whole cluster may have
// been down for a night), so until the first live one the node is unanchored and
// follows its wall clock forward (never back behind the state machine clock). A clock
// far off when a whole cluster starts cannot be told from a long outage.
type stampClock struct {
	wall func() time.Time
	mono func() time.Duration

	mu       sync.Mutex
	prev     time.Time     // latest state-machine time seen (own stamp or applied clock)
	at       time.Duration // mono() when prev was current
	anchored bool          // prev and at may bound stamps
	// liveAfter is the last log index this node held when it started: entries past it
	// are applied live.
	liveAfter uint64
	lastWarn  time.Duration
}

// processStart anchors the default monotonic clock.
var processStart = time.Now()

// monotonic is the default Config.Monotonic: Go's monotonic clock, which wall-clock
// steps do not move.
func monotonic() time.Duration { return time.Since(processStart) }

// observe notes the state machine clock after the entry at index applied.
func (c *stampClock) observe(clock idemkv.Timestamp, index uint64) {
	t := clock.Time()
	c.mu.Lock()
	defer c.mu.Unlock()
	if clock == 0 || !t.After(c.prev) {
		if index > c.liveAfter && clock != 0 && !c.anchored {
			// A live entry: the state machine time is current now.
			c.at, c.anchored = c.mono(), true
		}
		return
	}
	c.prev, c.at = t, c.mono()
	c.anchored = c.anchored || index > c.liveAfter
}

// bound is fsm.BoundStamp from the anchor, or the wall clock (never behind prev) while
// unanchored.
func (c *stampClock) bound(now time.Duration, wall time.Time) (time.Time, bool) {
	if !c.anchored || unboundedClock() {
		if wall.Before(c.prev) {
			return c.prev, false
		}
		return wall, false
	}
	return fsm.BoundStamp(c.prev, now-c.at, wall)
}

// read returns the bounded time without advancing the clock (for reads and checks).
func (c *stampClock) read() (idemkv.Timestamp, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, clamped := c.bound(c.mono(), c.wall())
	return idemkv.TimestampOf(s), clamped
}

// stamp returns the stamp for a command about to be proposed and makes it the latest
// time seen. warn reports that a clamp is worth a log line now.
func (c *stampClock) stamp() (ts idemkv.Timestamp, clamped, warn bool, wall time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now, wall := c.mono(), c.wall()
	s, clamped := c.bound(now, wall)
	if !s.Before(c.prev) {
		c.prev, c.at, c.anchored = s, now, true
	}
	if clamped && (c.lastWarn == 0 || now-c.lastWarn >= clockWarnEvery) {
		c.lastWarn, warn = now, true
	}
	return idemkv.TimestampOf(s), clamped, warn, wall
}

// watchClock keeps the stamp clock up with the state machine clock, so that a node that
// becomes leader bounds its stamps from the last time the cluster stamped, measured on
// its own monotonic clock from when it applied that stamp.
func (n *Node) watchClock() {
	defer n.wg.Done()
	for {
		changed := n.fsm.Changed()
		n.clock.observe(n.fsm.Clock(), n.fsm.AppliedIndex())
		select {
		case <-changed:
		case <-n.ctx.Done():
			return
		}
	}
}

// now is the time reads and checks use: the bounded clock, never behind the state
// machine's.
func (n *Node) now() idemkv.Timestamp {
	t, _ := n.clock.read()
	return max(t, n.fsm.Clock())
}

// stampNow is the time a command is stamped with. A clamp is counted and logged.
func (n *Node) stampNow() idemkv.Timestamp {
	t, clamped, warn, wall := n.clock.stamp()
	if clamped {
		n.metrics.ClockStampsClamped.Inc()
		if warn {
			n.log.Warn("wall clock outside the bound of the state machine clock; stamps follow the bound",
				"wall", wall.UTC().Format(idemkv.TimeFormat), "stamp", t.String(), "off_by", wall.Sub(t.Time()).Round(time.Millisecond))
		}
	}
	return max(t, n.fsm.Clock())
}
