package e2e

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// runCLI runs the real binary in the module root and returns its output.
func runCLI(t *testing.T, args ...string) string {
	t.Helper()
	bin := harness.Binary(t) // a first build can take minutes: not part of the run's bound
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = harness.ModuleRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("reliable-mqtt %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Benthos's own CLI works in our binary and knows our plugins.
func TestCLIListsLintsAndEchoesWithOurPlugins(t *testing.T) {
	if out := runCLI(t, "--version"); !strings.Contains(out, "Version:") {
		t.Fatalf("--version printed %q", out)
	}
	list := runCLI(t, "list", "inputs", "outputs", "processors")
	for _, name := range []string{"reliable_mqtt_in", "reliable_mqtt_out", "dedup_ledger", "generate"} {
		if !strings.Contains(list, name) {
			t.Errorf("`list` does not show %s", name)
		}
	}
	configs, err := filepath.Glob(filepath.Join(harness.ModuleRoot(t), "config", "*.yaml"))
	if err != nil || len(configs) == 0 {
		t.Fatalf("no configs: %v", err)
	}
	runCLI(t, append([]string{"lint"}, configs...)...)
	echo := runCLI(t, "-c", filepath.Join("config", "bridge.yaml"), "echo")
	if !strings.Contains(echo, "reliable_mqtt_in:") || !strings.Contains(echo, "ack_topic: reliable/acks") {
		t.Fatalf("`echo` of the bridge config:\n%s", echo)
	}
}

var (
	httpSection   = regexp.MustCompile(`(?m)^http:[ \t]*\n((?:[ \t]+.*\n)*)`)
	httpLoopback  = regexp.MustCompile(`(?m)^[ \t]+address:[ \t]*"?127\.0\.0\.1:(\d+)"?[ \t]*$`)
	httpDisabled  = regexp.MustCompile(`(?m)^[ \t]+enabled:[ \t]*false[ \t]*$`)
	httpByCommand = regexp.MustCompile(`-s http\.address=127\.0\.0\.1:(\d+)`)
)

// Every example in config/ can run beside the others on one host: its HTTP
// server is off, or on 127.0.0.1 with a port no other example uses. A
// stream file of the quickstart may not have an http section (streams mode
// refuses it), so its header documents the -s flag that does the same; the
// flag is checked to work with that file.
func TestExampleConfigsListenOnLoopbackOnTheirOwnPorts(t *testing.T) {
	configs, err := filepath.Glob(filepath.Join(harness.ModuleRoot(t), "config", "*.yaml"))
	if err != nil || len(configs) == 0 {
		t.Fatalf("no configs: %v", err)
	}
	ports := map[string]string{}
	for _, path := range configs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name, text := filepath.Base(path), string(b)
		port := ""
		if sec := httpSection.FindStringSubmatch(text); sec != nil {
			if m := httpLoopback.FindStringSubmatch(sec[1]); m != nil {
				port = m[1]
			} else if !httpDisabled.MatchString(sec[1]) {
				t.Errorf("%s: http section neither disabled nor on 127.0.0.1:<port>:\n%s", name, sec[0])
				continue
			}
		} else if m := httpByCommand.FindStringSubmatch(text); m != nil {
			port = m[1]
			runCLI(t, "-c", path, "-s", "http.address=127.0.0.1:"+port, "lint")
		} else {
			t.Errorf("%s: no http section and no documented -s http.address=127.0.0.1:<port>", name)
			continue
		}
		if port == "" {
			continue
		}
		if other, ok := ports[port]; ok {
			t.Errorf("%s and %s both use port %s", name, other, port)
		}
		ports[port] = name
	}
}

// `reliable-mqtt test` passes on every run for every config with unit
// tests, in one working directory: a test must not depend on what an
// earlier run left in a ledger.
func TestExampleConfigUnitTestsPassOnEveryRun(t *testing.T) {
	root := harness.ModuleRoot(t)
	configs, err := filepath.Glob(filepath.Join(root, "config", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir() // the working directory, where relative data paths land
	tested := 0
	for _, path := range configs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^tests:`).Match(b) {
			continue
		}
		tested++
		for run := 1; run <= 3; run++ {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			cmd := exec.CommandContext(ctx, harness.Binary(t), "test", path)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			cancel()
			if err != nil || !strings.Contains(string(out), "Test '"+path+"' succeeded") {
				t.Fatalf("run %d of `reliable-mqtt test %s` failed: %v\n%s", run, filepath.Base(path), err, out)
			}
		}
	}
	if tested < 2 {
		t.Fatalf("%d configs with unit tests in config/, want ledger_notify.yaml and ledger_relay.yaml at least", tested)
	}
}

// protocol_version passes the linter with each version it names, and a
// version it does not name stops the process at start with the field named.
func TestProtocolVersionLintsAndRefusesOthers(t *testing.T) {
	dir := t.TempDir()
	config := func(version string) string {
		path := filepath.Join(dir, "v"+version+".yaml")
		text := `http: {enabled: false}
input:
  reliable_mqtt_in:
    urls: ["tcp://127.0.0.1:1"]
    client_id: lint-in
    topics: ["a/b"]
    protocol_version: "` + version + `"
output:
  reliable_mqtt_out:
    urls: ["tcp://127.0.0.1:1"]
    topic: c/d
    outbox: {path: ` + filepath.Join(dir, "outbox.db") + `}
    protocol_version: "` + version + `"
`
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	runCLI(t, "lint", config("3.1.1"), config("5"))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, harness.Binary(t), "-c", config("4")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `protocol_version: "4" is not one of 3.1.1, 5`) {
		t.Fatalf("protocol_version 4: err %v, output:\n%s", err, out)
	}
}

// Every example `--help` shows works as written, in that order, in a
// directory laid out like a release tarball (config/ beside the binary):
// the pipeline runs and creates its outbox, lint passes, list shows our
// plugins, create writes a config, outbox stat reads the file the
// pipeline made.
func TestHelpExamplesWork(t *testing.T) {
	help := runCLI(t, "--help")
	var examples []string
	desc, _, _ := strings.Cut(help, "COMMANDS:")
	_, desc, _ = strings.Cut(desc, "DESCRIPTION:")
	for _, line := range strings.Split(desc, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "reliable-mqtt ") {
			examples = append(examples, l)
		}
	}
	if len(examples) < 4 || strings.Contains(help, "kafka") {
		t.Fatalf("--help shows %d examples (or still kafka):\n%s", len(examples), help)
	}
	dir := t.TempDir()
	if err := os.CopyFS(filepath.Join(dir, "config"), os.DirFS(filepath.Join(harness.ModuleRoot(t), "config"))); err != nil {
		t.Fatal(err)
	}
	// The examples name the command reliable-mqtt, whatever the file
	// under test is called ($RELIABLE_MQTT_BIN may be /tmp/x-bin).
	bin := t.TempDir()
	target, err := filepath.Abs(harness.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(bin, "reliable-mqtt")); err != nil {
		t.Fatal(err)
	}
	path := bin + string(os.PathListSeparator) + os.Getenv("PATH")
	for _, ex := range examples {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "sh", "-c", "exec "+ex)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PATH="+path)
		var out harness.LogBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if strings.Contains(ex, " -c ") {
			// A pipeline runs until stopped: stop it once it runs.
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			running := func() bool {
				select {
				case <-exited:
					return false
				default:
					return true
				}
			}
			// A pipeline that exits has failed: stop waiting for it.
			harness.Poll(90*time.Second, func() bool { return out.Contains("Output type reliable_mqtt_out is now active") || !running() })
			ok := out.Contains("Output type reliable_mqtt_out is now active")
			_ = cmd.Process.Signal(os.Interrupt)
			<-exited // bounded by ctx
			cancel()
			if !ok {
				t.Fatalf("%s did not run:\n%s", ex, out.String())
			}
			continue
		}
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("%s: %v\n%s", ex, err, out.String())
		}
		if strings.Contains(ex, " create ") {
			if b, err := os.ReadFile(filepath.Join(dir, "my-pipeline.yaml")); err != nil || !strings.Contains(string(b), "reliable_mqtt_out:") {
				t.Fatalf("%s wrote no config with reliable_mqtt_out (%v)", ex, err)
			}
		}
	}
}

// A config without an http section (the quickstart's stream files, run
// alone) serves HTTP on loopback, not on every interface as Benthos does.
// The line is logged before the listen, so a port held by someone else
// (the process then stops, see below) does not change what this checks.
func TestHTTPServerDefaultsToLoopback(t *testing.T) {
	path := filepath.Join(t.TempDir(), "one.yaml")
	conf := "input:\n  generate:\n    count: 1\n    interval: \"\"\n    mapping: root = \"x\"\noutput:\n  drop: {}\n"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, harness.Binary(t), "-c", path).CombinedOutput()
	if !strings.Contains(string(out), "Listening for HTTP requests at: http://127.0.0.1:4195") {
		t.Fatalf("a config without http did not listen on 127.0.0.1:4195:\n%s", out)
	}
}

// A process whose HTTP address is taken stops at start, naming the address,
// instead of running on without /ready and /metrics (Benthos's behaviour).
func TestHTTPAddressInUseStopsTheProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	path := filepath.Join(t.TempDir(), "idle.yaml")
	conf := "input:\n  generate:\n    interval: 1s\n    mapping: root = \"x\"\noutput:\n  drop: {}\n"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.Binary(t), "-c", path, "-s", "http.address="+ln.Addr().String())
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("still running after 60 s with its HTTP address taken:\n%s", out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, out)
	}
	if want := "stopping: listen tcp " + ln.Addr().String(); !strings.Contains(string(out), want) {
		t.Fatalf("output does not say %q:\n%s", want, out)
	}
}
