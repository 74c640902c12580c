package powerloss

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// The guest: Debian's kernel package unpacked, an initramfs of
// busybox-static, the static binary and the scenario's configs, and one
// virtio disk (ext4, cache=writeback) that qemu writes into a host file.
// qemu runs under software emulation (TCG): the KVM device of the machines
// we test on cannot run a standard guest.
//
// With cache=writeback every write qemu took from the guest is in the
// host's page cache, which survives qemu's SIGKILL: a cut loses exactly what
// the guest had not yet written out to its disk (its own page cache, and
// writes in flight). What a disk's own cache loses between flushes is
// replay_test.go's job.

// kernelModules, in load order: virtio's PCI transport and block driver,
// then ext4 and what it needs (modinfo's "depends", and crc32c for its
// metadata checksums, which ext4 asks the crypto API for).
var kernelModules = []string{
	"drivers/virtio/virtio_ring", "drivers/virtio/virtio",
	"drivers/virtio/virtio_pci_legacy_dev", "drivers/virtio/virtio_pci_modern_dev",
	"drivers/virtio/virtio_pci", "drivers/block/virtio_blk",
	"lib/crc16", "crypto/crc32c_generic", "fs/mbcache", "fs/jbd2/jbd2", "fs/ext4/ext4",
}

// debs unpacks the Debian packages the guest is made of into a cache
// directory shared by runs (downloaded once with apt-get, from Debian's
// mirror) and returns the kernel, the modules directory and busybox.
func debs(t *testing.T) (kernel, modules, busybox string) {
	t.Helper()
	cache := filepath.Join(os.TempDir(), "reliable-mqtt-powerloss-debs")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	lockMu.Lock()
	defer lockMu.Unlock()
	kpkg := kernelPackage(t)
	root := filepath.Join(cache, "root")
	done := filepath.Join(cache, kpkg+".unpacked")
	if _, err := os.Stat(done); err != nil {
		_ = os.RemoveAll(root)
		dl := filepath.Join(cache, "dl")
		_ = os.RemoveAll(dl)
		if err := os.MkdirAll(dl, 0o755); err != nil {
			t.Fatal(err)
		}
		run(t, dl, 10*time.Minute, "apt-get", "download", kpkg, "busybox-static")
		files, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
		if len(files) != 2 {
			t.Fatalf("apt-get download left %v in %s, want two packages", files, dl)
		}
		for _, f := range files {
			run(t, dl, 5*time.Minute, "dpkg-deb", "-x", f, root)
		}
		if err := os.WriteFile(done, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ks, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	ms, _ := filepath.Glob(filepath.Join(root, "lib", "modules", "*", "kernel"))
	if len(ks) != 1 || len(ms) != 1 {
		t.Fatalf("unpacked kernel package: kernels %v, module dirs %v; want one each", ks, ms)
	}
	return ks[0], ms[0], filepath.Join(root, "bin", "busybox")
}

var lockMu sync.Mutex

// kernelPackage resolves Debian's current amd64 kernel image package.
func kernelPackage(t *testing.T) string {
	t.Helper()
	out := run(t, "", time.Minute, "apt-cache", "depends", "linux-image-amd64")
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1]
		}
	}
	t.Fatalf("apt-cache depends linux-image-amd64 names no kernel package:\n%s", out)
	return ""
}

func run(t *testing.T, dir string, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// staticBinary builds cmd/reliable-mqtt without cgo (the guest has no
// libc), with the given build tags, once per tag set per test binary.
func staticBinary(t *testing.T, tags string) string {
	t.Helper()
	binMu.Lock()
	defer binMu.Unlock()
	if p, ok := builtBins[tags]; ok {
		return p
	}
	out := filepath.Join(binDir(t), "reliable-mqtt"+strings.ReplaceAll(tags, ",", "-"))
	args := []string{"build", "-o", out}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/reliable-mqtt")...)
	cmd.Dir = harness.ModuleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -tags %q: %v\n%s", tags, err, b)
	}
	builtBins[tags] = out
	return out
}

var (
	binMu     sync.Mutex
	builtBins = map[string]string{}
	binDirs   string // removed by TestMain
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDirs != "" {
		_ = os.RemoveAll(binDirs)
	}
	os.Exit(code)
}

func binDir(t *testing.T) string {
	if binDirs == "" {
		d, err := os.MkdirTemp("", "reliable-mqtt-powerloss-bin-")
		if err != nil {
			t.Fatal(err)
		}
		binDirs = d
	}
	return binDirs
}

// initramfs writes a newc cpio archive: busybox as /bin/busybox, the
// kernel modules under /lib/mod, the binary as /bin/reliable-mqtt, and
// files (name -> content; mode 0755 for names ending in .sh or "init").
func initramfs(t *testing.T, dst, busybox, modules, bin string, files map[string][]byte) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	c := &cpio{w: w}
	for _, d := range []string{"bin", "dev", "proc", "sys", "data", "lib", "lib/mod", "etc", "tmp", "cfg"} {
		c.dir(d)
	}
	c.file("bin/busybox", readFile(t, busybox), 0o755)
	c.file("bin/reliable-mqtt", readFile(t, bin), 0o755)
	for _, m := range kernelModules {
		c.file("lib/mod/"+filepath.Base(m)+".ko", readFile(t, filepath.Join(modules, m+".ko")), 0o644)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		mode := uint32(0o644)
		if n == "init" || strings.HasSuffix(n, ".sh") {
			mode = 0o755
		}
		c.file(n, files[n], mode)
	}
	c.trailer()
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// cpio writes the "newc" format the kernel unpacks into its rootfs.
type cpio struct {
	w   io.Writer
	ino uint32
}

func (c *cpio) header(name string, mode uint32, size int) {
	c.ino++
	fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name)+1, 0)
	io.WriteString(c.w, name+"\x00")
	c.pad(110 + len(name) + 1)
}

func (c *cpio) pad(n int) {
	if r := n % 4; r != 0 {
		c.w.Write(make([]byte, 4-r))
	}
}

func (c *cpio) dir(name string) { c.header(name, 0o040755, 0) }

func (c *cpio) file(name string, b []byte, perm uint32) {
	c.header(name, 0o100000|perm, len(b))
	c.w.Write(b)
	c.pad(len(b))
}

func (c *cpio) trailer() { c.header("TRAILER!!!", 0, 0) }

// initScript mounts the disk and runs scenario (a shell fragment) with
// CYCLE set from the kernel command line. "powerloss: start" marks the
// moment the scenario's processes start.
func initScript(scenario string) []byte {
	var b bytes.Buffer
	b.WriteString("#!/bin/busybox sh\n/bin/busybox --install -s /bin\n")
	b.WriteString("mount -t proc proc /proc\nmount -t sysfs sys /sys\nmount -t devtmpfs dev /dev\n")
	// Loopback: the embedded broker's clients dial it on 127.0.0.1.
	b.WriteString("ifconfig lo 127.0.0.1 up\n")
	for _, m := range kernelModules {
		fmt.Fprintf(&b, "insmod /lib/mod/%s.ko\n", filepath.Base(m))
	}
	b.WriteString(`for i in 1 2 3 4 5 6 7 8 9 10; do [ -b /dev/vda ] && break; sleep 0.2; done
mount -t ext4 /dev/vda /data || { echo "powerloss: mount failed"; poweroff -f; }
CYCLE=$(sed -n 's/.*powerloss.cycle=\([0-9]*\).*/\1/p' /proc/cmdline)
export CYCLE
echo "powerloss: start cycle $CYCLE"
`)
	b.WriteString(scenario)
	b.WriteString("\necho \"powerloss: scenario ended\"\nsync\npoweroff -f\n")
	return b.Bytes()
}

// disk makes an empty ext4 image of size MiB.
func disk(t *testing.T, path string, mib int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(mib) << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	run(t, "", time.Minute, "mkfs.ext4", "-q", "-F", path)
}

// cycle is one boot of the guest that ends in a cut (or in the scenario's
// end, which the caller treats as a failed cycle).
type cycle struct {
	Serial   string              // what the guest printed on its console
	Acks     map[string][]string // acknowledged IDs, by path
	Killed   bool                // qemu was SIGKILLed (the cut)
	After    time.Duration       // the cut came this long after the mark
	Started  bool                // the mark was seen before the cut
	BootTook time.Duration       // from qemu's start to "powerloss: start"
	Seen     map[string]int64    // with a drive: each ack's drive.seen() when it was first seen
}

// drive changes a boot: args replace the plain disk (qemu's
// -blockdev/-device arguments) and seen is what to note when an
// acknowledgement is first seen (replay_test.go); until, if set, ends the
// boot (SIGKILL) as soon as the lines printed so far satisfy it, before the
// cut's time (relay_test.go's setup and drain boots).
type drive struct {
	args  []string
	seen  func() int64
	until func(acks map[string][]string) bool
}

// boot runs qemu on img with initrd and SIGKILLs it cut after the mark:
// the scenario's start ("powerloss: start" on the console) when after is
// "", else the first acknowledgement of path after. Each path's lines go
// to a serial port of its own, a file here.
func boot(t *testing.T, g guest, img string, n int, after string, cut time.Duration, d *drive) cycle {
	t.Helper()
	// Bounds the whole boot: software emulation on a loaded machine took
	// up to 60 s to reach the scenario and 30 s more to its first ack.
	const limit = 6 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	dir := t.TempDir()
	args := []string{
		"-accel", "tcg", "-m", "1024", "-smp", "1", "-nodefaults", "-no-reboot",
		"-display", "none", "-monitor", "none", "-serial", "stdio",
	}
	ackFile := filepath.Join(dir, "acks")
	args = append(args, "-serial", "file:"+ackFile)
	// no_timer_check: on a loaded host the emulated timer can miss the
	// kernel's IO-APIC check, which then panics before init.
	args = append(args,
		"-kernel", g.kernel, "-initrd", g.initrd,
		"-append", fmt.Sprintf("console=ttyS0 quiet panic=-1 no_timer_check rdinit=/init powerloss.cycle=%d", n))
	if d == nil || d.args == nil {
		args = append(args, "-drive", "file="+img+",format=raw,if=virtio,cache=writeback")
	} else {
		args = append(args, d.args...)
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting qemu: %v", err)
	}
	var mu sync.Mutex
	var serial bytes.Buffer
	var startedAt time.Time
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			mu.Lock()
			serial.WriteString(line)
			if startedAt.IsZero() && strings.Contains(line, "powerloss: start") {
				startedAt = time.Now()
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	waited := make(chan error, 1)
	go func() { <-readDone; waited <- cmd.Wait() }()
	c := cycle{Seen: map[string]int64{}}
	note := func() {
		if d == nil || d.seen == nil {
			return
		}
		b, _ := os.ReadFile(ackFile)
		at := d.seen()
		for _, ids := range acks(string(b)) {
			for _, id := range ids {
				if _, ok := c.Seen[id]; !ok {
					c.Seen[id] = at
				}
			}
		}
	}
	marked := func() (time.Time, bool) {
		mu.Lock()
		at := startedAt
		mu.Unlock()
		if at.IsZero() {
			return at, false
		}
		if after == "" {
			return at, true
		}
		b, _ := os.ReadFile(ackFile)
		return time.Now(), len(acks(string(b))[after]) > 0
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var cutAt <-chan time.Time // armed once the mark is seen
	var markAt time.Time
wait:
	for {
		select {
		case <-tick.C:
			note()
			if d != nil && d.until != nil && !markAt.IsZero() {
				if b, _ := os.ReadFile(ackFile); d.until(acks(string(b))) {
					c.After = time.Since(markAt)
					_ = cmd.Process.Kill()
					c.Killed = true
					<-waited
					break wait
				}
			}
			if cutAt != nil {
				continue
			}
			if at, ok := marked(); ok {
				c.Started, markAt = true, at
				cutAt = time.After(time.Until(at.Add(cut)))
			}
		case <-cutAt:
			c.After = time.Since(markAt)
			_ = cmd.Process.Kill() // SIGKILL: the power cut
			c.Killed = true
			<-waited
			break wait
		case <-waited:
			break wait
		case <-ctx.Done():
			<-waited
			break wait
		}
	}
	note()
	mu.Lock()
	c.Serial = serial.String()
	if !startedAt.IsZero() {
		c.BootTook = startedAt.Sub(began)
	}
	mu.Unlock()
	b, _ := os.ReadFile(ackFile)
	c.Acks = acks(string(b))
	return c
}

// extract replays the ext4 journal of img (as the next mount would) and
// copies the directory dir out of it into dst, without mounting: e2fsck's
// journal_only mode and debugfs's rdump, from e2fsprogs.
func extract(t *testing.T, img, dir, dst string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Exit code 1 means "the file system was changed" (the journal replayed).
	out, err := exec.CommandContext(ctx, "e2fsck", "-E", "journal_only", "-y", img).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); err != nil && !(ok && ee.ExitCode() == 1) {
		t.Fatalf("e2fsck -E journal_only %s: %v\n%s", img, err, out)
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, "", 2*time.Minute, "debugfs", "-R", fmt.Sprintf("rdump %s %s", dir, dst), img)
}
