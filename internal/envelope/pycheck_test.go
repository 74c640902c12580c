package envelope

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"testing"
	"time"
)

// TestCanonicalAgreesWithPython runs reliomq's JSON rules in a real Python
// (testdata/pycheck.py) on a few thousand generated inputs, valid and not,
// and checks that Canonical accepts exactly what Python accepts and prints
// the same bytes. It is skipped where python3 is not installed; the golden
// vectors cover the same ground without Python.
func TestCanonicalAgreesWithPython(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed; skipping the differential check against Python's json")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "testdata/pycheck.py", "20240601", "3000").Output()
	if err != nil {
		t.Fatalf("running testdata/pycheck.py: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		var row struct {
			In  string  `json:"in"`
			Out *string `json:"out"`
		}
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			t.Fatalf("pycheck line %d: %v", n, err)
		}
		n++
		in, _ := hex.DecodeString(row.In)
		got, err := Canonical(in)
		switch {
		case row.Out == nil && err == nil:
			t.Errorf("input %q: Python rejects it, Canonical accepted it as %q", in, got)
		case row.Out != nil && err != nil:
			want, _ := hex.DecodeString(*row.Out)
			t.Errorf("input %q: Python accepts it as %q, Canonical rejected it: %v", in, want, err)
		case row.Out != nil:
			want, _ := hex.DecodeString(*row.Out)
			if !bytes.Equal(got, want) {
				t.Errorf("input %q:\n got %q\nwant %q (Python)", in, got, want)
			}
		}
	}
	if n < 1000 {
		t.Fatalf("pycheck produced only %d cases", n)
	}
}
