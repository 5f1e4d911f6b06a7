// gitops-check: the GitOps tools' own code run on our objects, so that tests check what Flux, Helm and Argo CD
// would say rather than our reading of their rules (hack/build-kube builds it; tests/cluster/test_gitops.py and
// tests/unit/test_argocd_scripts.py use it).
//
//	gitops-check kstatus              objects (a JSON list) on stdin -> [{"status", "message"}] with kstatus'
//	                                  status.Compute from github.com/fluxcd/cli-utils, the fork Flux and Helm 4 use
//	gitops-check health SCRIPT        objects on stdin -> [{"status", "message"}] from an Argo CD health.lua
//	gitops-check action SCRIPT        one object on stdin -> the object the Argo CD action.lua returns
//	gitops-check discovery SCRIPT     one object on stdin -> the actions an Argo CD discovery.lua offers
//	gitops-check test DIR             runs DIR/health_test.yaml and DIR/actions/action_test.yaml's discovery
//	                                  tests (Argo CD's layout): exit 1 on a mismatch
//
// The Lua state is built as Argo CD builds it for a script from argocd-cm (util/lua/lua.go, argo-cd v3.6):
// gopher-lua at the version Argo CD pins, the standard libraries NOT opened, then only package, base, table and a
// safe os with time and date. A script that uses string or math fails here as it would in Argo CD. The object is
// handed over as Argo CD hands it (integers as numbers), and the result is read back through gopher-json.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	luajson "layeh.com/gopher-json"
	"sigs.k8s.io/yaml"
)

type verdict struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: gitops-check kstatus | health SCRIPT | action SCRIPT | discovery SCRIPT | test DIR")
	}
	switch os.Args[1] {
	case "kstatus":
		var out []verdict
		for _, obj := range readObjects() {
			res, err := status.Compute(&unstructured.Unstructured{Object: obj})
			if err != nil {
				fail("kstatus: %v", err)
			}
			out = append(out, verdict{string(res.Status), res.Message})
		}
		emit(out)
	case "health":
		script := readScript(2)
		var out []verdict
		for _, obj := range readObjects() {
			v, err := health(script, obj)
			if err != nil {
				fail("health.lua: %v", err)
			}
			out = append(out, v)
		}
		emit(out)
	case "action", "discovery":
		script := readScript(2)
		objs := readObjects()
		if len(objs) != 1 {
			fail("%s takes one object", os.Args[1])
		}
		l, err := run(script, objs[0])
		if err != nil {
			fail("%s: %v", os.Args[1], err)
		}
		defer l.Close()
		raw, err := luajson.Encode(l.Get(-1))
		if err != nil {
			fail("%s: %v", os.Args[1], err)
		}
		os.Stdout.Write(append(raw, '\n'))
	case "test":
		if len(os.Args) < 3 {
			fail("test DIR")
		}
		os.Exit(test(os.Args[2]))
	default:
		fail("unknown command %q", os.Args[1])
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gitops-check: "+format+"\n", args...)
	os.Exit(2)
}

func emit(v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		fail("%v", err)
	}
	os.Stdout.Write(append(raw, '\n'))
}

func readScript(at int) string {
	if len(os.Args) <= at {
		fail("%s SCRIPT", os.Args[1])
	}
	return readFile(os.Args[at])
}

// readObjects: a JSON (or YAML) list of objects, or one object, on stdin.
func readObjects() []map[string]any {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("%v", err)
	}
	var list []map[string]any
	if err := decode(raw, &list); err == nil {
		return list
	}
	var one map[string]any
	if err := decode(raw, &one); err != nil {
		fail("stdin is neither a list of objects nor an object: %v", err)
	}
	return []map[string]any{one}
}

// decode: YAML or JSON into v with integers as int64, as the API machinery's clients hold objects.
func decode(raw []byte, v any) error {
	asJSON, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return err
	}
	return utiljson.Unmarshal(asJSON, v)
}

// run executes script with the global obj set, in a state built as Argo CD builds one for a configured script.
func run(script string, obj map[string]any) (*lua.LState, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{{lua.LoadLibName, lua.OpenPackage}, {lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs}} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)); err != nil {
			l.Close()
			return nil, err
		}
	}
	l.SetGlobal("obj", toLua(l, obj))
	if err := l.DoString(script); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

func health(script string, obj map[string]any) (verdict, error) {
	l, err := run(script, obj)
	if err != nil {
		return verdict{}, err
	}
	defer l.Close()
	ret := l.Get(-1)
	if ret.Type() != lua.LTTable {
		return verdict{}, fmt.Errorf("expect table output from Lua script, not %s", ret.Type())
	}
	raw, err := luajson.Encode(ret)
	if err != nil {
		return verdict{}, err
	}
	var v verdict
	if err := json.Unmarshal(raw, &v); err != nil {
		return verdict{}, err
	}
	switch v.Status {
	case "Healthy", "Progressing", "Degraded", "Suspended", "Missing", "Unknown":
		return v, nil
	}
	return verdict{"Unknown", "Lua returned an invalid health status"}, nil
}

// openSafeOs: the os library Argo CD lets scripts use (time and date only).
func openSafeOs(l *lua.LState) int {
	mod := l.RegisterModule(lua.OsLibName, map[string]lua.LGFunction{
		"time": func(l *lua.LState) int { l.Push(lua.LNumber(time.Now().Unix())); return 1 },
		"date": func(l *lua.LState) int {
			// the form the built-in actions use: os.date("!%Y-%m-%dT%XZ")
			if l.GetTop() >= 1 && l.CheckString(1) == "!%Y-%m-%dT%XZ" {
				l.Push(lua.LString(time.Now().UTC().Format("2006-01-02T15:04:05Z")))
				return 1
			}
			l.RaiseError("gitops-check implements os.date only for \"!%%Y-%%m-%%dT%%XZ\"")
			return 0
		},
	})
	l.Push(mod)
	return 1
}

func toLua(l *lua.LState, value any) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case int64:
		return lua.LNumber(v)
	case int:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []any:
		t := l.CreateTable(len(v), 0)
		for _, item := range v {
			t.Append(toLua(l, item))
		}
		return t
	case map[string]any:
		t := l.CreateTable(0, len(v))
		for key, item := range v {
			t.RawSetH(lua.LString(key), toLua(l, item))
		}
		return t
	}
	return lua.LNil
}

func readFile(path string) string {
	raw, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	return string(raw)
}

// readCase: a test case's input object, DIR/PATH.
func readCase(dir, path string) map[string]any {
	var obj map[string]any
	if err := decode([]byte(readFile(filepath.Join(dir, path))), &obj); err != nil {
		fail("%s: %v", path, err)
	}
	return obj
}

// discoveryTests runs the discoveryTests of DIR/action_test.yaml (Argo CD's layout) through DIR/discovery.lua:
// the actions offered and whether each is disabled, as Argo CD lists them. None there: nothing to run.
func discoveryTests(dir string) int {
	raw, err := os.ReadFile(filepath.Join(dir, "action_test.yaml"))
	if os.IsNotExist(err) {
		return 0
	} else if err != nil {
		fail("%v", err)
	}
	var cases struct {
		DiscoveryTests []struct {
			InputPath string `json:"inputPath"`
			Result    []struct {
				Name     string `json:"name"`
				Disabled bool   `json:"disabled"`
			} `json:"result"`
		} `json:"discoveryTests"`
	}
	if err := yaml.Unmarshal(raw, &cases); err != nil {
		fail("action_test.yaml: %v", err)
	}
	script := readFile(filepath.Join(dir, "discovery.lua"))
	bad := 0
	for _, c := range cases.DiscoveryTests {
		got, err := discover(script, readCase(dir, c.InputPath))
		if err != nil {
			fmt.Printf("FAIL actions %s: %v\n", c.InputPath, err)
			bad++
			continue
		}
		want := map[string]bool{}
		for _, r := range c.Result {
			want[r.Name] = r.Disabled
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			fmt.Printf("FAIL actions %s: got %v, want %v\n", c.InputPath, got, want)
			bad++
			continue
		}
		fmt.Printf("ok   actions %s: %v\n", c.InputPath, got)
	}
	return bad
}

// discover: the actions a discovery.lua offers for obj, name -> disabled (Argo CD: enabled unless "disabled").
func discover(script string, obj map[string]any) (map[string]bool, error) {
	l, err := run(script, obj)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	raw, err := luajson.Encode(l.Get(-1))
	if err != nil {
		return nil, err
	}
	offered := map[string]map[string]any{}
	if string(raw) != "[]" {
		if err := json.Unmarshal(raw, &offered); err != nil {
			return nil, err
		}
	}
	out := map[string]bool{}
	for name, action := range offered {
		disabled, _ := action["disabled"].(bool)
		out[name] = disabled
	}
	return out, nil
}

// test runs an Argo CD health_test.yaml: each case's inputPath through DIR/health.lua against its healthStatus.
func test(dir string) int {
	raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
	if err != nil {
		fail("%v", err)
	}
	var cases struct {
		Tests []struct {
			HealthStatus verdict `json:"healthStatus"`
			InputPath    string  `json:"inputPath"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(raw, &cases); err != nil {
		fail("health_test.yaml: %v", err)
	}
	script := readFile(filepath.Join(dir, "health.lua"))
	bad := 0
	for _, c := range cases.Tests {
		got, err := health(script, readCase(dir, c.InputPath))
		if err != nil {
			fmt.Printf("FAIL %s: %v\n", c.InputPath, err)
			bad++
			continue
		}
		if got != c.HealthStatus {
			fmt.Printf("FAIL %s: got %+v, want %+v\n", c.InputPath, got, c.HealthStatus)
			bad++
			continue
		}
		fmt.Printf("ok   %s: %s\n", c.InputPath, got.Status)
	}
	if len(cases.Tests) == 0 {
		fmt.Println("FAIL: no tests")
		return 1
	}
	bad += discoveryTests(filepath.Join(dir, "actions"))
	if bad > 0 {
		return 1
	}
	return 0
}
