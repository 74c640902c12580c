package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/reliable-mqtt/reliable-mqtt/tests/harness"
)

// promDir holds the shipped alerting rules and dashboard.
func promDir(t *testing.T) string {
	return filepath.Join(harness.ModuleRoot(t), "resources", "prometheus")
}

// The shipped alerting rules are valid (`promtool check rules`) and fire,
// and only fire, where their unit tests say (`promtool test rules`), with
// the exporter's default names and again with `naming: prometheus` (the
// same tests, their series renamed as that mode names them).
func TestAlertingRulesPassPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found: tests/run installs Debian's prometheus package, which has it")
	}
	run := func(dir string, args ...string) {
		t.Helper()
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool %s (in %s): %v\n%s", strings.Join(args, " "), dir, err, out)
		}
	}
	run(promDir(t), "check", "rules", "alerts.yml")
	run(promDir(t), "test", "rules", "alerts_test.yml")

	tests, err := os.ReadFile(filepath.Join(promDir(t), "alerts_test.yml"))
	if err != nil {
		t.Fatal(err)
	}
	renamed := string(tests)
	for _, counter := range []string{"reliable_mqtt_out_acks_ignored", "reliable_mqtt_out_confirmed", "dedup_ledger_conflicts", "dedup_ledger_errors", "reliable_mqtt_in_acked"} {
		if !strings.Contains(renamed, "'"+counter+"{") {
			t.Fatalf("alerts_test.yml has no series %s to rename", counter)
		}
		renamed = strings.ReplaceAll(renamed, "'"+counter+"{", "'"+counter+"_total{")
	}
	const ageMs = "'reliable_mqtt_out_oldest_pending_age_ms{job=\"rm\",instance=\"gw-1:4195\",label=\"bridge\",path=\"root.output\"}'\n        values: '0+60000x40'"
	if !strings.Contains(renamed, ageMs) {
		t.Fatal("alerts_test.yml changed its oldest-age series; update the renaming")
	}
	renamed = strings.Replace(renamed, ageMs, strings.NewReplacer("_age_ms", "_age_seconds", "0+60000x40", "0+60x40").Replace(ageMs), 1)
	dir := t.TempDir()
	rules, err := os.ReadFile(filepath.Join(promDir(t), "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yml"), []byte(renamed), 0o644); err != nil {
		t.Fatal(err)
	}
	run(dir, "test", "rules", "alerts_test.yml")
}

type ruleGroups struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert string `yaml:"alert"`
			Expr  string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		Type        string `json:"type"`
		Title       string `json:"title"`
		Description string `json:"description"`
		Targets     []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var metricName = regexp.MustCompile(`\b(?:reliable_mqtt|dedup_ledger)_[a-z0-9_]+`)

// The Grafana dashboard is JSON with a row per rule group, and under it a
// panel over every series that group's rules use, naming the alerts it
// explains; every series the rules use is one the components export.
func TestDashboardHasAPanelPerRuleFamily(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(promDir(t), "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleGroups
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	b, err = os.ReadFile(filepath.Join(promDir(t), "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash dashboard
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json is not JSON: %v", err)
	}
	exported := exportedMetricNames(t)

	// The panels under each row, by row title.
	rows := map[string][]int{}
	row := ""
	for i, p := range dash.Panels {
		if p.Type == "row" {
			row = p.Title
			rows[row] = nil
			continue
		}
		rows[row] = append(rows[row], i)
	}
	if len(rules.Groups) == 0 {
		t.Fatal("no rule groups in alerts.yml")
	}
	for _, g := range rules.Groups {
		panels, ok := rows[g.Name]
		if !ok || len(panels) == 0 {
			t.Errorf("rule group %s has no row of panels in the dashboard", g.Name)
			continue
		}
		var exprs, descs strings.Builder
		for _, i := range panels {
			descs.WriteString(dash.Panels[i].Description + "\n")
			for _, tg := range dash.Panels[i].Targets {
				exprs.WriteString(tg.Expr + "\n")
			}
		}
		for _, r := range g.Rules {
			if !strings.Contains(descs.String(), r.Alert) {
				t.Errorf("no panel of row %s names alert %s", g.Name, r.Alert)
			}
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				if !strings.Contains(exprs.String(), m) {
					t.Errorf("alert %s uses %s, which no panel of row %s shows", r.Alert, m, g.Name)
				}
				base := strings.TrimSuffix(m, "_seconds") // naming: prometheus
				if !exported[m] && !exported[base+"_ms"] && !exported[base+"_ns"] {
					t.Errorf("alert %s uses %s, which no component exports", r.Alert, m)
				}
			}
		}
	}
}

// exportedMetricNames are the metric names the plugins register (the
// default naming; naming: prometheus adds _total or turns _ms into _seconds).
func exportedMetricNames(t *testing.T) map[string]bool {
	names := map[string]bool{}
	decl := regexp.MustCompile(`New(?:Counter|Gauge|Timer)\("([a-z0-9_]+)"`)
	err := filepath.WalkDir(filepath.Join(harness.ModuleRoot(t), "plugin"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		b, err := os.ReadFile(path)
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			names[m[1]] = true
		}
		return err
	})
	if err != nil || len(names) == 0 {
		t.Fatalf("reading the plugins' metric names: %v (%d found)", err, len(names))
	}
	return names
}
