package promexport

import (
	"context"
	"fmt"
	"testing"
)

type warnings []string

func (w *warnings) Warnf(format string, args ...any) { *w = append(*w, fmt.Sprintf(format, args...)) }

// TestFamilies checks name mangling, one family per name, the refusal of a
// conflicting reuse, and that a negative increment is ignored.
func TestFamilies(t *testing.T) {
	var w warnings
	e, err := New(Config{}, &w)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	c := e.Counter("a.b-c", []string{"re.ason"})
	c("x").Incr(2)
	c("x").Incr(-5)
	e.Counter("a.b-c", []string{"re.ason"})("x").Incr(1) // same family
	e.Gauge("a.b-c", nil)("").Set(7)                     // conflict: dropped
	e.Timer("9t", nil)().Timing(1000)
	e.Counter("9t", nil)().Incr(1)    // conflict: dropped
	e.Timer("a.b-c", nil)().Timing(1) // conflict: dropped
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		m := f.GetMetric()[0]
		switch {
		case m.Counter != nil:
			if l := m.GetLabel()[0]; l.GetName() != "re_ason" || l.GetValue() != "x" {
				t.Errorf("label %v, want re_ason=x", l)
			}
			got[f.GetName()] = m.Counter.GetValue()
		case m.Summary != nil:
			got[f.GetName()] = m.Summary.GetSampleSum()
		default:
			t.Errorf("unexpected family %s", f.GetName())
		}
	}
	if got["a_b_c"] != 3 || got["_9t"] != 1000 || len(got) != 2 {
		t.Errorf("families %v, want a_b_c=3 and _9t=1000", got)
	}
	if len(w) != 3 {
		t.Errorf("warnings %q, want one each about the conflicting gauge, counter and timer", w)
	}
}

func TestConfigRefused(t *testing.T) {
	for _, c := range []Config{
		{Buckets: []float64{2, 1}},
		{PushURL: "http://127.0.0.1:1", PushInterval: 0},
	} {
		if _, err := New(c, new(warnings)); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}
