package nemesis

import (
	"slices"
	"testing"
)

func TestParseFamilies(t *testing.T) {
	all, err := ParseFamilies("all")
	if err != nil || !slices.Equal(all, Families) {
		t.Fatalf("all = %v, %v", all, err)
	}
	none, err := ParseFamilies("none")
	if err != nil || len(none) != 0 {
		t.Fatalf("none = %v, %v", none, err)
	}
	two, err := ParseFamilies("kill, clock")
	if err != nil || !slices.Equal(two, []string{FamilyKill, FamilyClock}) {
		t.Fatalf("kill, clock = %v, %v", two, err)
	}
	if _, err := ParseFamilies("kill,meteor"); err == nil {
		t.Fatal("an unknown family was accepted")
	}
	for _, f := range Families {
		if len(kinds[f]) == 0 {
			t.Errorf("family %s has no faults", f)
		}
	}
}
