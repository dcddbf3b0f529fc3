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
		regexp.MustCompile(`total +2 tickets for 2 approved operations`),
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
}
