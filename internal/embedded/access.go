package embedded

import (
	"bufio"
	"bytes"
	"crypto/pbkdf2"
	"crypto/sha512"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/hooks/auth"
	"github.com/mochi-mqtt/server/v2/packets"
	"golang.org/x/crypto/bcrypt"
	"gopkg.in/yaml.v3"
)

// Access control for the `listen` listener. The private in-process
// listener (127.0.0.1, a kernel-chosen port) stays open to this process's
// own components; every client of a `listen` listener must log in with a
// user of the users file when one is set, and may then publish and
// subscribe only where the ACL file lets it.

// isLoopback reports whether a listen address only accepts connections from
// this host.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// users maps a user name to its password hash.
type users map[string]string

// loadUsers reads a mosquitto password file: "user:hash" lines, blank lines
// and # comments ignored. Hashes are bcrypt ($2a$, $2b$, $2y$) or
// mosquitto_passwd's PBKDF2-SHA512 ($7$).
func loadUsers(path string) (users, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("users file: %w", err)
	}
	u := users{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, hash, ok := strings.Cut(line, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("users file %s line %d: want user:hash", path, n)
		}
		if !strings.HasPrefix(hash, "$2") && !strings.HasPrefix(hash, "$7$") {
			return nil, fmt.Errorf("users file %s line %d: user %q: unsupported hash (want bcrypt $2a$/$2b$/$2y$ or mosquitto_passwd's $7$)", path, n, name)
		}
		u[name] = hash
	}
	if len(u) == 0 {
		return nil, fmt.Errorf("users file %s holds no user", path)
	}
	return u, nil
}

// check reports whether password is name's.
func (u users) check(name string, password []byte) bool {
	hash, ok := u[name]
	if !ok {
		return false
	}
	if strings.HasPrefix(hash, "$2") {
		return bcrypt.CompareHashAndPassword([]byte(hash), password) == nil
	}
	return checkPBKDF2(hash, password)
}

// checkPBKDF2 verifies mosquitto's "$7$<iterations>$<salt>$<hash>" (base64,
// PBKDF2-HMAC-SHA512).
func checkPBKDF2(hash string, password []byte) bool {
	parts := strings.Split(hash, "$")
	if len(parts) != 5 {
		return false
	}
	iter, err1 := strconv.Atoi(parts[2])
	salt, err2 := base64.StdEncoding.DecodeString(parts[3])
	want, err3 := base64.StdEncoding.DecodeString(parts[4])
	if err1 != nil || err2 != nil || err3 != nil || iter < 1 {
		return false
	}
	got, err := pbkdf2.Key(sha512.New, string(password), salt, iter, len(want))
	return err == nil && subtle.ConstantTimeCompare(got, want) == 1
}

// acl is a user's topic rights: filters it may publish to (write) and
// subscribe to (read). Anything not listed is denied.
type acl struct {
	Read  []string `yaml:"read"`
	Write []string `yaml:"write"`
}

// loadACL reads a YAML file keyed by user name:
//
//	publisher:
//	  write: [ reliable/ingress ]
//	  read:  [ reliable/acks ]
func loadACL(path string) (map[string]acl, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("acl file: %w", err)
	}
	var m map[string]acl
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("acl file %s: %w (want user: {read: [filters], write: [filters]})", path, err)
	}
	return m, nil
}

func (a acl) allows(topic string, write bool) bool {
	filters := a.Read
	if write {
		filters = a.Write
	}
	for _, f := range filters {
		if auth.RString(f).FilterMatches(topic) {
			return true
		}
	}
	return false
}

// accessHook authenticates and authorises clients of the `listen`
// listeners. Clients of the private in-process listener pass.
type accessHook struct {
	mqtt.HookBase
	private string // the in-process listener's ID
	users   users  // nil: no login required (loopback listen only)
	acls    map[string]acl
}

func (h *accessHook) ID() string { return "reliable-mqtt-access" }

func (h *accessHook) Provides(b byte) bool {
	return b == mqtt.OnConnectAuthenticate || b == mqtt.OnACLCheck
}

func (h *accessHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	if cl.Net.Listener == h.private || h.users == nil {
		return true
	}
	return h.users.check(string(pk.Connect.Username), pk.Connect.Password)
}

func (h *accessHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if cl.Net.Listener == h.private || h.acls == nil {
		return true
	}
	a, ok := h.acls[string(cl.Properties.Username)]
	return ok && a.allows(topic, write)
}

// loadTLS reads the listener's certificate and key.
func loadTLS(certFile, keyFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tls_cert and tls_key must be given together")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("listener certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
