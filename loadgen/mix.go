package loadgen

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/idemkv/idemkv"
)

// Kind is one kind of agent operation.
type Kind int

const (
	// KindNew runs a fresh operation: reserve (execute) then commit.
	KindNew Kind = iota
	// KindReplay reserves a committed key with its own fingerprint: a retry that must
	// get the stored receipt back.
	KindReplay
	// KindConflict reserves a committed key with another fingerprint: a reused key.
	KindConflict
	// KindInProgress reserves one of a few pending keys that another attempt holds:
	// workers contending for an operation that is still running.
	KindInProgress
	numKinds
)

var kindNames = [numKinds]string{"new", "replay", "conflict", "in_progress"}

func (k Kind) String() string {
	if k < 0 || k >= numKinds {
		return "kind(" + strconv.Itoa(int(k)) + ")"
	}
	return kindNames[k]
}

// expected is the decision each kind must get; anything else is counted as an error.
func (k Kind) expected() idemkv.Decision {
	return [numKinds]idemkv.Decision{idemkv.DecisionExecute, idemkv.DecisionReplay,
		idemkv.DecisionConflict, idemkv.DecisionInProgress}[k]
}

// Mix weighs the kinds of operation; each worker draws the kind of its next operation
// with these weights. Only the ratios matter.
type Mix struct {
	New        int `json:"new"`
	Replay     int `json:"replay"`
	Conflict   int `json:"conflict"`
	InProgress int `json:"in_progress"`
}

// DefaultMix is a plausible agent fleet: mostly first attempts, many retries, a few
// reused keys and a few duplicate deliveries racing a running operation.
func DefaultMix() Mix { return Mix{New: 50, Replay: 40, Conflict: 5, InProgress: 5} }

func (m Mix) weight(k Kind) int {
	return [numKinds]int{m.New, m.Replay, m.Conflict, m.InProgress}[k]
}

func (m Mix) total() int { return m.New + m.Replay + m.Conflict + m.InProgress }

// Validate reports negative weights and a mix that selects nothing.
func (m Mix) Validate() error {
	for k := Kind(0); k < numKinds; k++ {
		if m.weight(k) < 0 {
			return idemkv.Invalid("mix", "weight of %s must not be negative", k)
		}
	}
	if m.total() == 0 {
		return idemkv.Invalid("mix", "at least one weight must be positive")
	}
	return nil
}

// pick maps r in [0, total) to a kind, so that each kind gets its share of the range.
func (m Mix) pick(r int) Kind {
	for k := Kind(0); k < numKinds; k++ {
		w := m.weight(k)
		if r < w {
			return k
		}
		r -= w
	}
	return numKinds - 1
}

// String formats m as ParseMix reads it.
func (m Mix) String() string {
	return fmt.Sprintf("new=%d,replay=%d,conflict=%d,inprogress=%d", m.New, m.Replay, m.Conflict, m.InProgress)
}

// ParseMix reads "new=50,replay=40,conflict=5,inprogress=5". Kinds left out weigh zero.
func ParseMix(s string) (Mix, error) {
	var m Mix
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, val, ok := strings.Cut(part, "=")
		if !ok {
			return Mix{}, idemkv.Invalid("mix", "%q is not name=weight", part)
		}
		w, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil {
			return Mix{}, idemkv.Invalid("mix", "weight of %q is not an integer", name)
		}
		switch strings.TrimSpace(name) {
		case "new":
			m.New = w
		case "replay":
			m.Replay = w
		case "conflict":
			m.Conflict = w
		case "inprogress", "in_progress":
			m.InProgress = w
		default:
			return Mix{}, idemkv.Invalid("mix", "unknown kind %q (new, replay, conflict, inprogress)", name)
		}
	}
	return m, m.Validate()
}
