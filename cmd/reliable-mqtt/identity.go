package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/redpanda-data/benthos/v4/public/service"
	ucli "github.com/urfave/cli/v2"
)

// What the CLI calls itself, in help text and in every log line.
const (
	productName = "reliable-mqtt"
	description = "MQTT pipelines that keep every message through crashes, outages and broker restarts"
	docsURL     = "https://github.com/reliable-mqtt/reliable-mqtt/tree/main/docs"
)

// defaultConfigPaths are tried in order when no -c is given; the Debian
// package installs the first.
var defaultConfigPaths = []string{"/etc/reliable-mqtt/config.yaml"}

// Build stamps, set by the release script from `git describe --tags`:
//
//	go build -ldflags "-X main.version=v1.2.3 -X main.commit=<sha> -X main.date=<RFC 3339>"
//
// Left empty, they come from the Go toolchain's build info (a module version
// for `go install …@vX` or a tagged checkout, the VCS revision and commit
// time for a build in a git checkout with -buildvcs on). A build no tag
// names is "devel".
var version, commit, date string

// buildStamp returns the version (with the commit it was built from, when
// known) and the build date that `--version` prints.
func buildStamp() (ver, built string) {
	ver, rev, built := version, commit, date
	modified := false
	if info, ok := debug.ReadBuildInfo(); ok {
		if ver == "" && tagged(info.Main.Version) {
			ver = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if rev == "" {
					rev = s.Value
				}
			case "vcs.time":
				if built == "" {
					built = s.Value
				}
			case "vcs.modified":
				modified = commit == "" && s.Value == "true"
			}
		}
	}
	if ver == "" {
		ver = "devel"
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if modified {
			rev += "-dirty"
		}
		ver = fmt.Sprintf("%s (commit %s)", ver, rev)
	}
	if built == "" {
		built = "unknown"
	}
	return ver, built
}

// tagged reports whether a module version from the build info names a
// tag: not "(devel)", and not the pseudo-version v0.0.0-<time>-<commit>
// that the toolchain makes up for a commit with no tag before it.
func tagged(v string) bool {
	return v != "" && v != "(devel)" && !strings.HasPrefix(v, "v0.0.0-")
}

// defaultHTTPAddress is loopback: Benthos listens on every interface by
// default, and a gateway should not expose its metrics and debug endpoints
// on its WAN link unless its config says so.
const defaultHTTPAddress = "127.0.0.1:4195"

// configSchema is Benthos's full schema with our service name as the
// default `@service` field of every structured log line, and the HTTP
// server on loopback unless a config says otherwise.
func configSchema() *service.ConfigSchema {
	ver, built := buildStamp()
	s := service.GlobalEnvironment().FullConfigSchema(ver, built)
	s.SetFieldDefault(map[string]any{"@service": productName}, "logger", "static_fields")
	s.SetFieldDefault(defaultHTTPAddress, "http", "address")
	return s
}

// Benthos's root usage line is a fixed sentence ending in its own docs URL
// (CLIOptSetDocumentationURL changes only the URL, and the same URL is
// prefixed to Benthos's guide paths in the streams, blobl and template
// help, which stay Benthos's). The app help template is urfave/cli's
// documented hook for the text, so the NAME line is ours there.
func init() {
	const nameLine = `{{template "helpNameTemplate" .}}`
	if !strings.Contains(ucli.AppHelpTemplate, nameLine) {
		return // a newer urfave/cli: TestHelpNamesOurProduct says so
	}
	ucli.AppHelpTemplate = strings.Replace(ucli.AppHelpTemplate, nameLine,
		"{{.HelpName}} - "+description+"\n   Documentation: "+docsURL, 1)
}
