package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The example is also a test: it must tell its story and end with one ticket per
// approved operation (run returns an error otherwise).
func TestStory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, options{dataDir: t.TempDir()}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	t.Log(text)
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`worker-a: outcome unknown .*deadline exceeded`),
		regexp.MustCompile(`worker-b: recover -> (LIN-\d+) \(the probe found the ticket`),
		regexp.MustCompile(`worker-[cd]: execute -> LIN-\d+`),
		regexp.MustCompile(`worker-[cd]: replay -> LIN-\d+`),
		regexp.MustCompile(`worker-e: conflict, nothing executed`),
		regexp.MustCompile(`worker-f: replay -> LIN-\d+`),
		regexp.MustCompile(`agent\.idempotency\.decision +conflict`),
		// Step 5: a crash without a probe, then ls --in-doubt and resolve.
		regexp.MustCompile(`worker-g: outcome unknown .*deadline exceeded`),
		regexp.MustCompile(`worker-h: in doubt, left for a person: .*approval_19`),
		regexp.MustCompile(`worker-i: in doubt, left for a person`),
		regexp.MustCompile(`\$ idemkv ls --tenant tenant_42 --in-doubt\n +conversation_9:approval_19:create_ticket +in doubt since`),
		regexp.MustCompile(`\$ idemkv resolve tenant_42 conversation_9:approval_19:create_ticket --committed --remote-system linear --remote-id (LIN-\d+)`),
		regexp.MustCompile(`total +3 tickets for 3 approved operations`),
	} {
		if !want.MatchString(text) {
			t.Errorf("output lacks %s", want)
		}
	}
	if strings.Contains(text, "WRONG") {
		t.Error("an approved operation did not get exactly one ticket")
	}
	recovered := regexp.MustCompile(`worker-b: recover -> (LIN-\d+)`).FindStringSubmatch(text)
	replayed := regexp.MustCompile(`worker-f: replay -> (LIN-\d+)`).FindStringSubmatch(text)
	if recovered == nil || replayed == nil || recovered[1] != replayed[1] {
		t.Errorf("the late retry replayed %v, the recovery committed %v", replayed, recovered)
	}
	resolved := regexp.MustCompile(`--remote-id (LIN-\d+)`).FindStringSubmatch(text)
	settled := regexp.MustCompile(`worker-j: replay -> (LIN-\d+)`).FindStringSubmatch(text)
	if resolved == nil || settled == nil || resolved[1] != settled[1] {
		t.Errorf("after the resolve the next delivery got %v, the operator committed %v", settled, resolved)
	}
	// worker-i answered in doubt without taking the key over: its span has no fence.
	if i := strings.Index(text, "worker-i:"); i < 0 || strings.Contains(text[i:strings.Index(text, "The operator lists")], "idemkv.fence") {
		t.Error("the retry of an in-doubt key took a fence")
	}
}
