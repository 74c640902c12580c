package conffield

import (
	"strings"
	"testing"
	"time"

	"github.com/redpanda-data/benthos/v4/public/service"
)

func parsed(t *testing.T, yaml string) *service.ParsedConfig {
	t.Helper()
	spec := service.NewConfigSpec().Fields(
		service.NewStringField("name").Default(""),
		service.NewIntField("n").Default(1),
		service.NewDurationField("wait").Default("1s"),
		service.NewStringField("mode").Default("a"),
		service.NewBoolField("on").Default(false),
	)
	pc, err := spec.ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

// Read fills every target in order, and stops at the first field that is
// refused, naming it.
func TestReadFillsTargetsAndStopsAtTheFirstRefusal(t *testing.T) {
	var name, mode string
	var n int
	var wait time.Duration
	var on bool
	err := Read(parsed(t, "name: x\nn: 3\nwait: 2s\nmode: b\non: true\n"),
		String(&name, "name"), Int(&n, "n"), PositiveDuration(&wait, "wait"), Enum(&mode, "mode", "a", "b"), Bool(&on, "on"))
	if err != nil || name != "x" || n != 3 || wait != 2*time.Second || mode != "b" || !on {
		t.Fatalf("got %q %d %s %q %v, err %v", name, n, wait, mode, on, err)
	}

	on = false
	err = Read(parsed(t, "wait: 0s\nmode: c\non: true\n"), PositiveDuration(&wait, "wait"), Enum(&mode, "mode", "a", "b"), Bool(&on, "on"))
	if err == nil || !strings.Contains(err.Error(), "wait must be positive") {
		t.Fatalf("wait 0s: %v", err)
	}
	if on {
		t.Fatal("a field after the refused one was read")
	}
	if err := Read(parsed(t, "mode: c\n"), Enum(&mode, "mode", "a", "b")); err == nil || !strings.Contains(err.Error(), `mode: "c" is not one of a, b`) {
		t.Fatalf("mode c: %v", err)
	}
}
