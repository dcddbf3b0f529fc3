package node

import (
	"context"
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
// current: an entry applied live, or the moment this node started stamping. Entries it
// replays from its own log after a start were stamped an unknown while ago, so until
// then the node is unanchored. An unanchored node never follows its wall clock: a node
// that followed it stamped its first entry after a restart with a clock 3 h fast at
// once, and the state machine clock jumped 3 h, expiring a live lease and a record
// committed seconds earlier (issue 22, point 1). Its first stamp anchors at the latest
// state-machine time instead (a leader first applies every entry of earlier terms:
// establish), so a clock wrong at boot moves the state machine clock no faster than
// fsm.ClockSlew allows. The price is that after a whole cluster was down, the state
// machine clock resumes where it stopped and catches up at a tenth of real time: a
// node cannot tell a clock far off from a long outage. The leader's clock ticks
// (tickClock) keep the time it stopped at recent.
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
	// lastStamp is mono() at this node's latest stamp (0: none yet).
	lastStamp time.Duration

	// applied is the state machine clock at the latest observe.
	applied idemkv.Timestamp
	// offset is the state machine clock minus this node's wall clock, measured when a
	// live entry advanced the state machine clock, at offsetAt on the monotonic clock.
	offset   time.Duration
	offsetAt time.Duration
	measured bool
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
	live := index > c.liveAfter && clock != 0
	now := c.mono()
	if clock != 0 && t.After(c.prev) {
		c.prev, c.at = t, now
	}
	if live && clock > c.applied {
		// A stamp applied now was made moments ago, on the leader's bounded clock
		// (this node's own, on a leader): what it differs from this node's wall clock
		// by is the offset between the two, less the replication delay.
		c.offset, c.offsetAt, c.measured = t.Sub(c.wall()), now, true
	}
	c.applied = max(c.applied, clock)
	if live && !c.anchored {
		// A live entry: the state machine time is current now.
		c.at, c.anchored = now, true
	}
}

// bound is fsm.BoundStamp from the anchor. An unanchored node reads at the latest
// state-machine time it has seen (its wall clock only when none was ever stamped).
func (c *stampClock) bound(now time.Duration, wall time.Time) (time.Time, bool) {
	if unboundedClock() || (!c.anchored && (c.prev.IsZero() || unanchoredStamps())) {
		if wall.Before(c.prev) {
			return c.prev, false
		}
		return wall, false
	}
	if !c.anchored {
		return c.prev, !wall.Equal(c.prev)
	}
	s, clamped := fsm.BoundStamp(c.prev, now-c.at, wall)
	if clamped && wall.After(s) && unboundedForwardClock() {
		return wall, false
	}
	return s, clamped
}

// read returns the bounded time without advancing the clock (for reads and checks).
func (c *stampClock) read() (idemkv.Timestamp, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, clamped := c.bound(c.mono(), c.wall())
	return idemkv.TimestampOf(s), clamped
}

// stamp returns the stamp for a command about to be proposed and makes it the latest
// time seen. An unanchored node anchors first, at the latest state-machine time it has
// seen (first). warn reports that a clamp is worth a log line now: a first stamp's
// always is.
func (c *stampClock) stamp() (ts idemkv.Timestamp, clamped, warn, first bool, wall time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now, wall := c.mono(), c.wall()
	if !c.anchored && !c.prev.IsZero() && !unanchoredStamps() {
		c.at, c.anchored, first = now, true, true
	}
	s, clamped := c.bound(now, wall)
	if !s.Before(c.prev) {
		c.prev, c.at, c.anchored = s, now, true
	}
	c.lastStamp = max(now, 1)
	// A leader's stamps are the state machine clock: its offset is theirs to its wall
	// clock.
	c.offset, c.offsetAt, c.measured = s.Sub(wall), now, true
	if clamped && (first || c.lastWarn == 0 || now-c.lastWarn >= clockWarnEvery) {
		c.lastWarn, warn = now, true
	}
	return idemkv.TimestampOf(s), clamped, warn, first, wall
}

// sinceStamp is how long ago, on the monotonic clock, this node last stamped a command;
// ok is false if it never has.
func (c *stampClock) sinceStamp() (d time.Duration, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastStamp == 0 {
		return 0, false
	}
	return c.mono() - c.lastStamp, true
}

// ClockState is what a node knows of its clock against the state machine's.
type ClockState struct {
	// Anchored: the node has applied a live entry or stamped one since it started.
	Anchored bool
	// Measured: Offset was measured, Age ago.
	Measured bool
	Offset   time.Duration
	Age      time.Duration
}

func (c *stampClock) state() ClockState {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := ClockState{Anchored: c.anchored, Measured: c.measured}
	if c.measured {
		s.Offset, s.Age = c.offset, c.mono()-c.offsetAt
	}
	return s
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

// stampNow is the time a command is stamped with. A clamp is counted and logged; so is
// every first stamp after a start that the bound clamped, whatever the rate limit.
func (n *Node) stampNow() idemkv.Timestamp {
	t, clamped, warn, first, wall := n.clock.stamp()
	if clamped {
		n.metrics.ClockStampsClamped.Inc()
		switch {
		case first:
			n.log.Warn("first stamp since start anchored at the state machine clock, not the wall clock; stamps catch up within fsm.ClockSlew of real time",
				"wall", wall.UTC().Format(idemkv.TimeFormat), "stamp", t.String(), "off_by", wall.Sub(t.Time()).Round(time.Millisecond))
		case warn:
			n.log.Warn("wall clock outside the bound of the state machine clock; stamps follow the bound",
				"wall", wall.UTC().Format(idemkv.TimeFormat), "stamp", t.String(), "off_by", wall.Sub(t.Time()).Round(time.Millisecond))
		}
	}
	return max(t, n.fsm.Clock())
}

// anchorClock makes the stamp clock of a node that just won an election start from the
// latest stamp committed: while it has applied no live entry since it started, it
// first applies every entry of earlier terms (a barrier), then raises its clock to the
// state machine's. Its first stamp then anchors there (stampClock.stamp).
func (n *Node) anchorClock(ctx context.Context) error {
	if n.clock.state().Anchored {
		return nil
	}
	if err := waitEither(ctx, n.raft.Barrier(n.cfg.ApplyTimeout)); err != nil {
		return err
	}
	n.clock.observe(n.fsm.Clock(), 0)
	return nil
}

// tickClock stamps an entry (this node's addresses, as establish does) whenever the
// leader has stamped nothing for Config.ClockTick, so that the state machine clock
// stays near real time in a quiet period: a node that restarts after one resumes from
// there (stampClock), and followers keep measuring their offset (localClockTrusted).
// It also ends, within ClockTick, any wait for an index the state machine would reach
// only with a write; the WedgeGap sabotage, the code from before both, has no tick.
func (n *Node) tickClock(ctx context.Context) {
	if n.cfg.ClockTick < 0 || n.establishByBarrier() {
		return
	}
	t := time.NewTicker(n.cfg.ClockTick / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// A member that joined or advertised since is counted at the next tick at the
		// latest; advanceFormat proposes nothing while the format holds.
		if err := n.advanceFormat(func(cmd *fsm.Command) error {
			_, err := n.propose(ctx, cmd)
			return err
		}); err != nil && ctx.Err() == nil {
			n.log.Debug("cluster format not advanced", "err", err)
		}
		if d, ok := n.clock.sinceStamp(); ok && d < n.cfg.ClockTick {
			continue
		}
		self := idemkv.NodeInfo{ID: n.cfg.ID, RaftAddr: string(n.transport.LocalAddr()), APIAddr: n.cfg.APIAddr}
		if _, err := n.propose(ctx, &fsm.Command{Op: fsm.OpSetNode, Node: &self}); err != nil && ctx.Err() == nil {
			n.log.Debug("clock tick not applied", "err", err)
		}
	}
}
